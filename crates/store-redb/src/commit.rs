//! The write transactions of one handle, and group commit.
//!
//! Every write transaction of a [`crate::RedbStore`] begins and commits here, with the handle's
//! durability (durable once the handle is dropped, see [`EndBounded`]), and is counted ([`crate::RedbStore::write_transactions`]).
//!
//! Recording goes through a queue. A call validates its event, pushes a job (the event, `now`
//! and a oneshot for its answer) and, when no drain is running, starts one on tokio's blocking
//! pool; then it awaits its oneshot. The drain takes up to `max_events` jobs, records them in
//! order in one write transaction (the per-event protocol of `record_tx` is unchanged: dedupe
//! hits within a batch, one sequence spent per call; the tables are opened once per
//! transaction), commits once, answers every job, and loops until the queue is empty; then it
//! keeps its thread for a few milliseconds for the next recording before it ends, holding the
//! handle only weakly meanwhile. So a lone caller costs one hand-off to a blocking thread, as
//! any other call, callers that arrive while a commit is in flight share the next one, and a
//! steady load is recorded by one thread, not by whichever thread of the pool is free at each
//! burst (see [`Drain::linger`] for the memory this saves). With durable commits, a drain about to take
//! a batch first waits (at most about one fsync) until every recording call in flight is
//! queued: the callers it has just answered mostly come straight back, and taking the queue
//! before they do split 16 looping callers into batches of about 15 and 1, alternately (about 9
//! events per transaction; with the wait, about 15.4, and `record/concurrent_16_tasks` went
//! from 3.7x to 4.9x one transaction per event in the same run). Before its last answers the drain lets go of
//! the handle's state, so a caller that then drops the last handle closes the file at once (the
//! next process to open it is not refused).
//!
//! - Cancel-safe: a caller that gives up drops its receiver; its event may still be committed
//!   (as with any cancelled write), and the others' commit goes on.
//! - An event that fails inside a shared transaction (a corrupt row, an I/O error while
//!   writing) aborts it; every job of the batch is then recorded alone, so the failure reaches
//!   only the callers it would have reached without batching. A failed commit fails every job
//!   of the batch (each gets its own copy of the error): whether it reached the disk is unknown,
//!   so nothing is retried.
//! - A drain that panics, or that the runtime drops before it runs, fails the jobs still queued
//!   (their callers get a backend error) and lets the next call start a new drain.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use awareness_core::{NewEvent, Recorded, StoreError, Timestamp};
use redb::WriteTransaction;
use tokio::sync::oneshot;

use crate::RecordTables;
use crate::db::{Ctx, Shared, lock};

type Reply = oneshot::Sender<Result<Recorded, StoreError>>;
/// The answers of a batch of recordings.
type Answers = Vec<(Reply, Result<Recorded, StoreError>)>;
/// Sends a write's result to its caller.
type SendAnswer = Box<dyn FnOnce() + Send>;
/// A write transaction other than recording: runs on the drain and returns how to answer.
type WriteJob = Box<dyn FnOnce(&Writer) -> SendAnswer + Send>;

/// One queued recording: a validated event.
struct Job {
    event: NewEvent,
    now: Timestamp,
    reply: Reply,
}

/// What the drain runs, in queue order.
// A recording stays inline: the queue holds a few dozen entries at most, and a box would cost
// every recording an allocation.
#[allow(clippy::large_enum_variant)]
enum Work {
    /// A recording, batched with the recordings queued next to it.
    Record(Job),
    /// Any other write transaction, run alone.
    Write(WriteJob),
}

/// What one step of the drain took from the queue.
enum Step {
    Records(Vec<Job>),
    Write(WriteJob),
}

/// What one step of the drain sends once it has let go of the writer (when the queue is empty).
enum Outcome {
    Records(Answers),
    Write(SendAnswer),
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Work>,
    /// A drain is running or about to: a new job needs no other.
    draining: bool,
    /// Recording calls between queueing their job and returning (answered ones included until
    /// they return): those the next batch may still hear from.
    in_flight: usize,
}

/// How long a drain of a durable handle waits, at most, for callers it has just answered to
/// come back with their next recording before it takes a batch (see [`Drain::run`]): about one
/// fsync, the price of the extra transaction the wait saves.
const STRAGGLER_WAIT: Duration = Duration::from_millis(1);

/// How long a drain that has emptied the queue keeps its thread, waiting for the next
/// recording, before it ends (see [`Drain::linger`]).
const LINGER: Duration = Duration::from_millis(10);

/// A writer's queue and its signal, shared with the drain, which holds the writer itself only
/// while it records.
struct Inbox {
    queue: Mutex<Queue>,
    /// Signalled when a job is queued or an in-flight call returns.
    arrivals: Condvar,
    /// The file, for the warning of a drain that stops with jobs queued (the writer may be
    /// gone by then).
    path: PathBuf,
}

impl Inbox {
    /// Waits on `arrivals`, for at most `timeout` in all, while `waiting` holds of the queue.
    fn wait_while<'a>(
        &self,
        q: MutexGuard<'a, Queue>,
        timeout: Duration,
        waiting: impl FnMut(&mut Queue) -> bool,
    ) -> MutexGuard<'a, Queue> {
        self.arrivals
            .wait_timeout_while(q, timeout, waiting)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
    }
}

/// Counts a recording call as in flight until it returns or is cancelled.
struct InFlight<'a>(&'a Writer);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.0.inbox.queue).in_flight -= 1;
        self.0.inbox.arrivals.notify_all();
    }
}

/// Begins, commits and counts the write transactions of one handle; batches recordings.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    /// Commits use redb's `Durability::None` (the bounded-loss mode), until the handle that
    /// runs the background flush is dropped ([`EndBounded`]).
    bounded: Arc<AtomicBool>,
    max_events: usize,
    /// Every write is refused ([`crate::RedbOptions::read_only`]).
    read_only: bool,
    inbox: Arc<Inbox>,
    commits: AtomicU64,
    /// The most recordings one batch has held.
    largest_batch: std::sync::atomic::AtomicUsize,
}

/// A write transaction of a [`Writer`], with the durability it was begun with.
pub(crate) struct Txn {
    txn: WriteTransaction,
    /// Begun with `Durability::None` (the bounded mode): its commit is left to a flush.
    bounded: bool,
}

impl std::ops::Deref for Txn {
    type Target = WriteTransaction;

    fn deref(&self) -> &WriteTransaction {
        &self.txn
    }
}

impl Txn {
    /// Aborts it: nothing it wrote is kept.
    pub(crate) fn abort(self) -> Result<(), redb::StorageError> {
        self.txn.abort()
    }
}

/// Ends a writer's bounded mode when dropped: its later commits are durable. A store handle
/// drops it before its background flush stops, so that a write whose caller gave up, which the
/// writer's drain may commit after the handle is gone, is not left to a flush that no longer
/// runs (another handle may keep the file open, and with it the commit non-durable, for good).
pub(crate) struct EndBounded(Arc<AtomicBool>);

impl Drop for EndBounded {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Writer {
    pub(crate) fn new(
        shared: Arc<Shared>,
        bounded: bool,
        max_events: usize,
        read_only: bool,
    ) -> Self {
        debug_assert!(max_events > 0, "checked at open");
        Self {
            bounded: Arc::new(AtomicBool::new(bounded)),
            max_events,
            read_only,
            inbox: Arc::new(Inbox {
                queue: Mutex::default(),
                arrivals: Condvar::new(),
                path: shared.path().to_owned(),
            }),
            commits: AtomicU64::new(0),
            largest_batch: std::sync::atomic::AtomicUsize::new(0),
            shared,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The refusal of a write on a read-only handle, before anything is queued.
    pub(crate) fn refuse(&self, what: &str) -> Result<(), StoreError> {
        if self.read_only {
            return Err(self.shared.read_only(what));
        }
        Ok(())
    }

    pub(crate) fn write_transactions(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    pub(crate) fn largest_batch(&self) -> usize {
        self.largest_batch.load(Ordering::Relaxed)
    }

    /// Whether commits are still left to the background flush.
    fn bounded(&self) -> bool {
        self.bounded.load(Ordering::Acquire)
    }

    /// What ends the bounded mode of this writer when dropped; see [`EndBounded`].
    pub(crate) fn end_bounded_on_drop(&self) -> EndBounded {
        EndBounded(Arc::clone(&self.bounded))
    }

    /// Begins a write transaction with the handle's durability. Blocking.
    pub(crate) fn begin(&self, what: &str) -> Result<Txn, StoreError> {
        let mut txn = self.shared.begin_write(what)?;
        // Decided once, after redb's write lock is taken, and kept for the whole transaction: one
        // begun before the handle's last flush is made durable by it (that flush takes the lock
        // after it), one begun after is durable itself.
        let bounded = self.bounded();
        if bounded {
            txn.set_durability(redb::Durability::None).ctx(what)?;
        }
        Ok(Txn { txn, bounded })
    }

    /// Commits `txn` and counts it. Blocking.
    pub(crate) fn commit(&self, mut txn: Txn, what: &str) -> Result<(), StoreError> {
        // A flush waiting for redb's write lock (which this drain takes again and again) is
        // made by this commit instead: durable, it makes every commit before it durable. It is
        // reported to the flush as served only once committed; a failure (or a panic) leaves
        // the flush to commit.
        let stands_in = if txn.bounded {
            self.shared.flush_to_stand_in_for()
        } else {
            None
        };
        if stands_in.is_some() {
            txn.txn
                .set_durability(redb::Durability::Immediate)
                .ctx(what)?;
            txn.bounded = false;
        }
        // Marked before the commit, while this transaction holds redb's write lock: a flush
        // that finds the mark then waits for the lock, and its durable commit covers this one.
        // Marked after, a flush between the commit and the mark would find none and leave this
        // commit to the next interval (a crash then losing two intervals). A commit that fails
        // leaves a mark for nothing: one durable commit too many.
        if txn.bounded {
            self.shared.mark_unflushed();
        }
        // Ends the stand-in however the commit ends, a panic included: the flush, which
        // holds redb's write lock by then, waits for that report (a second at most).
        let _stand_in = stands_in.map(|number| {
            self.shared.stand_in_begins(number);
            StandIn(&self.shared, number)
        });
        #[cfg(test)]
        let committed = if self.shared.commit_fails.swap(false, Ordering::AcqRel) {
            drop(txn.txn);
            Err(redb::CommitError::Storage(redb::StorageError::Io(
                std::io::Error::other("the commit's own failure"),
            )))
        } else {
            txn.txn.commit()
        };
        #[cfg(not(test))]
        let committed = txn.txn.commit();
        if let Err(e) = &committed {
            self.shared.commit_failed(e);
        }
        if let (Some(number), true) = (stands_in, committed.is_ok()) {
            self.shared.flush_stood_in(number);
        }
        committed.ctx(what)?;
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// With the bounded durability (of the transaction `tables` belong to), keeps the
    /// reservation of sequences ahead of what `tables` allocated (see the `tables` module):
    /// `true` when the commit must be durable.
    fn reserve(bounded: bool, tables: &mut RecordTables<'_>) -> Result<bool, StoreError> {
        if bounded {
            tables.reserve_ahead()
        } else {
            Ok(false)
        }
    }

    /// Commits a recording's `txn`, durably when it raised the reservation. Blocking.
    fn commit_reserving(&self, mut txn: Txn, durable: bool, what: &str) -> Result<(), StoreError> {
        if durable {
            // Durable, this commit also makes every non-durable one before it durable.
            txn.txn
                .set_durability(redb::Durability::Immediate)
                .ctx(what)?;
            txn.bounded = false;
        }
        self.commit(txn, what)
    }

    /// Records a validated event: queues it, starts a drain when none is running, and waits
    /// for the commit that holds it.
    pub(crate) async fn record(
        self: &Arc<Self>,
        event: NewEvent,
        now: Timestamp,
    ) -> Result<Recorded, StoreError> {
        self.refuse("record an event")?;
        let (reply, answer) = oneshot::channel();
        self.submit("record an event", Work::Record(Job { event, now, reply }))?;
        let _in_flight = InFlight(self);
        answer.await.map_err(|e| {
            StoreError::backend(
                "record: the writer stopped before answering (it panicked, or the runtime is shutting down)",
                e,
            )
        })?
    }

    /// Runs `f` on the drain, alone, in queue order with the recordings, and returns its result.
    ///
    /// Every write transaction of a handle runs on its drain, so that a steady load of
    /// recordings and pruning allocates redb's pages from one thread (see [`Drain::linger`]).
    /// A caller that gives up does not stop `f`, as with any cancelled write.
    pub(crate) async fn write<T, F>(
        self: &Arc<Self>,
        what: &'static str,
        f: F,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(&Writer) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        self.refuse(what)?;
        let (reply, answer) = oneshot::channel();
        self.submit(
            what,
            Work::Write(Box::new(move |w: &Writer| {
                // A panic fails this write alone, as an error its caller is given; the drain
                // goes on with the writes of other callers queued behind it.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(w)))
                    .unwrap_or_else(|panic| {
                        // As after any failed write: a latched I/O failure is noted.
                        w.shared().check_after_failure(None);
                        Err(w.panicked(what, &*panic))
                    });
                Box::new(move || drop(reply.send(result))) as SendAnswer
            })),
        )?;
        answer.await.map_err(|e| {
            StoreError::backend(
                format!("{what}: the writer stopped before answering (it panicked, or the runtime is shutting down)"),
                e,
            )
        })?
    }

    /// Queues `work` (a recording counts as in flight until its call returns) and starts a
    /// drain when none is running. A call that must start the drain outside a Tokio runtime is
    /// refused before queueing or counting anything: `spawn_blocking` would panic there, after
    /// a recording was counted in flight, for good (its call never returns), and every later
    /// lone recording of a durable handle would wait [`STRAGGLER_WAIT`] for it.
    fn submit(self: &Arc<Self>, what: &str, work: Work) -> Result<(), StoreError> {
        let start = {
            let mut q = lock(&self.inbox.queue);
            // Only a call that must start the drain needs the runtime: a drain already running
            // takes the job (and a recording, the hot path, pays no lookup for it).
            let start = if q.draining {
                None
            } else {
                Some(crate::runtime(what)?)
            };
            if matches!(work, Work::Record(_)) {
                q.in_flight += 1;
            }
            q.jobs.push_back(work);
            q.draining = true;
            start
        };
        self.inbox.arrivals.notify_all();
        if let Some(runtime) = start {
            let drain = Drain {
                writer: Some(Arc::clone(self)),
                weak: Arc::downgrade(self),
                inbox: Arc::clone(&self.inbox),
                ended: false,
            };
            // Detached: the caller awaits its answer, not the drain, so cancelling it cancels
            // nobody's commit. (A runtime shutting down drops the drain unrun: its `Drop` fails
            // the queued jobs and clears `draining`.)
            drop(runtime.spawn_blocking(move || drain.run()));
        }
        Ok(())
    }

    /// Records a batch: in one write transaction when it holds several jobs.
    fn run(&self, mut jobs: Vec<Job>) -> Answers {
        if jobs.len() == 1 {
            let job = jobs.pop().expect("one job");
            vec![self.run_one(job)]
        } else {
            self.run_batch(jobs)
        }
    }

    /// Records one job in its own write transaction. A panic fails this job alone, as an
    /// error its caller is given (the transaction is dropped while it unwinds, as in
    /// [`Self::run_batch`]); the drain goes on with the jobs queued behind it.
    fn run_one(&self, job: Job) -> (Reply, Result<Recorded, StoreError>) {
        let Job { event, now, reply } = job;
        let alone = || {
            self.begin("record").and_then(|txn| {
                let (rec, durable) = {
                    let mut tables = RecordTables::open(&txn)?;
                    let rec = crate::record_tx(&mut tables, event, now, self.shared.path())?;
                    (rec, Self::reserve(txn.bounded, &mut tables)?)
                };
                self.commit_reserving(txn, durable, "record")?;
                Ok(rec)
            })
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(alone))
            .unwrap_or_else(|panic| Err(self.panicked("record", &*panic)));
        if let Err(e) = &result {
            self.shared.check_after_failure(Some(e));
        }
        (reply, result)
    }

    /// The error of a write `what` that panicked with `panic`, logged with the file's path.
    /// redb marks the file for repair when a write transaction is dropped by a panic: the
    /// next read-write open repairs it.
    pub(crate) fn panicked(&self, what: &str, panic: &(dyn std::any::Any + Send)) -> StoreError {
        let message = awareness_core::error::panic_message(panic).to_owned();
        let path = self.shared.path();
        tracing::error!(path = %path.display(), panic = %message, "{what} panicked; only this write fails");
        // Named as [`StoreError::in_store`] names it, which then leaves it as it is.
        StoreError::backend(format!("{}: {what} panicked", path.display()), message)
    }

    /// Records several jobs in one write transaction.
    fn run_batch(&self, jobs: Vec<Job>) -> Answers {
        // A panic in redb's begin or commit fails the batch's callers with its message, as an
        // error does, and the drain goes on: unwinding out of here failed every job queued
        // behind the batch too, other callers' writes included, each told only that the
        // writer stopped.
        let begun = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.begin("record")))
            .unwrap_or_else(|panic| {
                self.shared.check_after_failure(None);
                Err(self.panicked("record (a group commit)", &*panic))
            });
        let txn = match begun {
            Ok(txn) => txn,
            Err(e) => return fail_all(jobs, &e),
        };
        let batch = &jobs;
        let path = self.shared.path();
        let shared = move || {
            let recorded = RecordTables::open(&txn).and_then(|mut tables| {
                let recorded = batch
                    .iter()
                    // A copy: should a later event fail, each job is recorded again alone.
                    .map(|job| crate::record_tx(&mut tables, job.event.clone(), job.now, path))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((recorded, Self::reserve(txn.bounded, &mut tables)?))
            });
            (txn, recorded)
        };
        // A panic fails the shared pass like an error: each job is then recorded alone, so
        // that only the one whose event panics fails (nothing of the pass was committed). The
        // transaction is dropped while the panic unwinds, inside the catch, as redb expects
        // of a transaction a panic left: it leaks its pages and marks the file for repair
        // instead of aborting over state the panic may have left half-changed.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(shared)) {
            Ok((txn, Ok((recorded, durable)))) => {
                let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    #[cfg(test)]
                    assert!(
                        !jobs
                            .iter()
                            .any(|j| j.event.summary == COMMIT_PANICS_IN_TESTS),
                        "the commit's own panic"
                    );
                    self.commit_reserving(txn, durable, "record")
                }))
                .unwrap_or_else(|panic| {
                    self.shared.check_after_failure(None);
                    Err(self.panicked("record (a group commit)", &*panic))
                });
                match committed {
                    Ok(()) => jobs
                        .into_iter()
                        .zip(recorded)
                        .map(|(job, rec)| (job.reply, Ok(rec)))
                        .collect(),
                    Err(e) => fail_all(jobs, &e),
                }
            }
            Ok((txn, Err(e))) => {
                tracing::debug!(path = %self.shared.path().display(), error = %awareness_core::error::ErrorChain(&e), "an event failed in a group commit; recording the batch one by one");
                drop(txn);
                // An I/O failure redb latched (the file at its size limit, say) is noted with
                // this error as its cause: each job recorded alone is then refused repeating
                // it, not redb's "Previous I/O error occurred".
                self.shared.check_after_failure(Some(&e));
                self.one_by_one(jobs)
            }
            Err(_) => {
                tracing::warn!(
                    path = %self.shared.path().display(),
                    "recording an event in a group commit panicked; recording the batch one by one"
                );
                self.one_by_one(jobs)
            }
        }
    }

    /// Records each job of a failed batch in its own transaction. A panic while recording one
    /// of them (redb meeting the damage that failed the batch, say) fails only that job
    /// ([`Self::run_one`]): unwinding out of here would drop the answers of those already
    /// committed, and they would be told they failed.
    fn one_by_one(&self, jobs: Vec<Job>) -> Answers {
        jobs.into_iter().map(|job| self.run_one(job)).collect()
    }
}

/// Test support ([`crate::RedbStore::hold_writer`]): the writer's drain waits, doing nothing,
/// until this is dropped.
#[derive(Debug)]
pub struct HeldWriter {
    /// Dropped, the only sender: the held drain's wait ends.
    _release: std::sync::mpsc::Sender<()>,
}

impl Writer {
    /// Queues a write that holds the drain until the answer is dropped, and returns once the
    /// drain runs it (the writes queued behind it then wait). A caller that gives up before
    /// then lets the drain go at once.
    pub(crate) async fn hold(self: &Arc<Self>) -> Result<HeldWriter, StoreError> {
        const WHAT: &str = "hold the writer";
        self.refuse(WHAT)?;
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (holding, held) = oneshot::channel();
        self.submit(
            WHAT,
            Work::Write(Box::new(move |_: &Writer| {
                let _ = holding.send(());
                // Ends with an error once the only sender is dropped.
                let _ = released.recv();
                Box::new(|| ()) as SendAnswer
            })),
        )?;
        held.await.map_err(|e| {
            StoreError::backend(
                format!(
                    "{WHAT}: the writer stopped before running it (the runtime is shutting down)"
                ),
                e,
            )
        })?;
        Ok(HeldWriter { _release: release })
    }
}

/// A commit standing in for flush number `.1`: dropped, it tells the flush the stand-in is
/// over (after [`Shared::flush_stood_in`] when it committed; otherwise the flush commits).
struct StandIn<'a>(&'a Shared, u64);

impl Drop for StandIn<'_> {
    fn drop(&mut self) {
        self.0.stand_in_over(self.1);
    }
}

/// Gives every job its own copy of `e`.
fn fail_all(jobs: Vec<Job>, e: &StoreError) -> Answers {
    jobs.into_iter()
        .map(|job| (job.reply, Err(e.for_another_caller())))
        .collect()
}

/// Takes the next step from the front of the queue: one write, or up to `max` recordings (those
/// queued before the next write).
fn take(jobs: &mut VecDeque<Work>, max: usize) -> Option<Step> {
    match jobs.pop_front()? {
        Work::Write(job) => Some(Step::Write(job)),
        Work::Record(first) => {
            let mut batch = vec![first];
            while batch.len() < max {
                match jobs.pop_front() {
                    Some(Work::Record(job)) => batch.push(job),
                    Some(write) => {
                        jobs.push_front(write);
                        break;
                    }
                    None => break,
                }
            }
            Some(Step::Records(batch))
        }
    }
}

fn answer(answers: Answers) {
    for (reply, result) in answers {
        // A caller that gave up has dropped its receiver: nothing to tell.
        let _ = reply.send(result);
    }
}

/// The drain of a writer's queue, run on the blocking pool. Dropped without finishing (a panic,
/// or a runtime shutting down before it ran), it fails the queued jobs and clears `draining`.
struct Drain {
    /// Held while recording, let go of before the last answers are sent: a caller that then
    /// drops the last handle closes the file at once (another process may open it next).
    writer: Option<Arc<Writer>>,
    /// The writer, without keeping it (and its file) open, while the drain lingers.
    weak: Weak<Writer>,
    inbox: Arc<Inbox>,
    /// `draining` was cleared with the queue empty: nothing is left to fail.
    ended: bool,
}

impl Drain {
    fn run(mut self) {
        while let Some(w) = self.writer.as_ref() {
            let step = {
                let q = lock(&self.inbox.queue);
                // Callers answered by the last batch are still in flight until they return, and
                // most come straight back with their next recording. Taking the queue before
                // they do would split a burst into a big batch and a small one, alternately;
                // so wait (briefly) until every in-flight call is queued or the batch is full.
                // Only durable commits are worth waiting for: a `Durability::None` commit is
                // cheap, and a second small batch costs less than the wait (measured: -27%).
                let mut q = self.inbox.wait_while(q, STRAGGLER_WAIT, |q| {
                    !w.bounded()
                        && matches!(q.jobs.front(), Some(Work::Record(_)))
                        && q.jobs.len() < q.in_flight.min(w.max_events)
                });
                take(&mut q.jobs, w.max_events)
            };
            let outcome = match step {
                Some(Step::Records(jobs)) => {
                    w.largest_batch.fetch_max(jobs.len(), Ordering::Relaxed);
                    Outcome::Records(w.run(jobs))
                }
                Some(Step::Write(job)) => Outcome::Write(job(w)),
                None => Outcome::Records(Vec::new()),
            };
            if lock(&self.inbox.queue).jobs.is_empty() {
                self.writer = None;
            }
            match outcome {
                Outcome::Records(answers) => answer(answers),
                Outcome::Write(send) => send(),
            }
            if self.writer.is_none() {
                self.writer = self.linger();
            }
        }
    }

    /// With the queue empty, keeps the thread for up to [`LINGER`] waiting for the next
    /// recording, holding the writer only weakly. Returns the writer when one came; otherwise
    /// ends the drain (`draining` cleared) and returns `None`.
    ///
    /// Why: a drain started per burst ran on whichever thread of the blocking pool was free, so
    /// over a long run many threads allocated redb's pages, and glibc gives each thread's
    /// allocations an arena of its own that keeps what it once held. The 4M-event scale run
    /// of the bounded mode reached 340 MiB of RSS that way; a 2M-event run with a single arena
    /// (`MALLOC_ARENA_MAX=1`) stayed at 73-76 MiB. Under a steady load one drain now keeps
    /// the queue: 138 to 141 MiB at the end of the 4M-event run, and 83-84 MiB, flat, once
    /// every other write went through the queue too ([`Writer::write`]).
    fn linger(&mut self) -> Option<Arc<Writer>> {
        let q = lock(&self.inbox.queue);
        let mut q = self.inbox.wait_while(q, LINGER, |q| q.jobs.is_empty());
        if q.jobs.is_empty() {
            q.draining = false;
            self.ended = true;
            return None;
        }
        drop(q);
        // A queued job's caller holds the store. Should it have been cancelled and the store
        // dropped meanwhile, the upgrade fails and `Drop` fails the orphans.
        self.weak.upgrade()
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.writer = None;
        let orphans: Vec<Work> = {
            let mut q = lock(&self.inbox.queue);
            q.draining = false;
            q.jobs.drain(..).collect()
        };
        if !orphans.is_empty() {
            tracing::warn!(
                path = %self.inbox.path.display(),
                jobs = orphans.len(),
                "the store-redb writer stopped with writes queued; they fail"
            );
        }
        // Dropping the jobs drops their senders: each caller gets an error.
        drop(orphans);
    }
}

/// The summary of an event whose recording panics, in this crate's unit tests.
#[cfg(test)]
pub(crate) const PANICS_IN_TESTS: &str = "this event's recording panics";

/// The summary of an event whose group commit panics, in this crate's unit tests.
#[cfg(test)]
pub(crate) const COMMIT_PANICS_IN_TESTS: &str = "this event's group commit panics";

#[cfg(test)]
mod tests {
    use std::task::{Context, Waker};

    use awareness_core::{ActorType, EventKind, EventStore, NewEvent, SessionRef, Timestamp};

    use crate::db::lock;

    /// A new store in a directory of its own, and a single-threaded runtime to drive it.
    fn on_one_thread() -> (tempfile::TempDir, tokio::runtime::Runtime, crate::RedbStore) {
        let dir = tempfile::tempdir().expect("dir");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let store = runtime
            .block_on(crate::RedbStore::open(dir.path().join("state.redb")))
            .expect("open");
        (dir, runtime, store)
    }

    /// [`on_one_thread`], with the check after a failed write made to panic (the test hook
    /// `check_panics`), and the session its recordings go to.
    fn the_check_panicking() -> (
        tempfile::TempDir,
        tokio::runtime::Runtime,
        crate::RedbStore,
        SessionRef,
    ) {
        let (dir, runtime, store) = on_one_thread();
        store
            .writer
            .shared()
            .check_panics
            .store(true, std::sync::atomic::Ordering::Release);
        let at = SessionRef::parse("agent:main:child", "main").expect("ref");
        (dir, runtime, store, at)
    }

    /// Runs one batch of recordings on `at` with these summaries through the writer's drain
    /// (outside any runtime, as the drain runs), catching nothing: a panic out of the drain
    /// fails the test. Answers each caller's answer, in order.
    fn run_batch(
        store: &crate::RedbStore,
        at: &SessionRef,
        summaries: &[&str],
    ) -> Vec<Result<super::Recorded, awareness_core::StoreError>> {
        let (jobs, replies): (Vec<super::Job>, Vec<_>) = summaries
            .iter()
            .map(|summary| {
                let (reply, answer) = tokio::sync::oneshot::channel();
                let event = NewEvent::new(
                    at.clone(),
                    EventKind::Compacted,
                    ActorType::System,
                    *summary,
                );
                let now = Timestamp(1_800_000_000_000);
                (super::Job { event, now, reply }, answer)
            })
            .unzip();
        let answers =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store.writer.run(jobs)))
                .expect("the batch's callers are answered, the panic caught inside");
        super::answer(answers);
        replies
            .into_iter()
            .map(|mut r| r.try_recv().expect("every caller is answered"))
            .collect()
    }

    /// A recording polled outside a Tokio runtime leaves the writer's queue as it found it:
    /// nothing queued, no drain marked as running, no call counted in flight. (A call counted
    /// in flight that never returns would make every later lone recording of a durable handle
    /// wait for it, `STRAGGLER_WAIT` each time.)
    #[test]
    fn a_recording_outside_a_runtime_leaves_the_queue_as_it_was() {
        let (_dir, runtime, store) = on_one_thread();
        let event = NewEvent::new(
            SessionRef::parse("agent:main:child", "main").expect("ref"),
            EventKind::Compacted,
            ActorType::System,
            "x",
        );
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store
                .record(event, Timestamp(1_800_000_000_000))
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_ready()
        }));
        {
            let q = lock(&store.writer.inbox.queue);
            assert_eq!(
                (q.jobs.len(), q.draining, q.in_flight),
                (0, false, 0),
                "(queued, draining, in flight)"
            );
        }
        assert_eq!(polled.ok(), Some(true), "answered at once, without a panic");
        runtime.block_on(store.close());
    }

    /// A drain that ended (its linger found the queue empty and cleared `draining`) leaves the
    /// queue to the drain started after it: a recording queued in between is the new drain's,
    /// not an orphan. (What the mutation did: the ended drain's `Drop` took that recording,
    /// whose caller was told the writer had stopped, and cleared `draining` under the new drain,
    /// so a third could run beside it; review of stop 69, RE20.)
    #[test]
    fn a_drain_that_ended_leaves_the_queue_to_the_next_drain() {
        let (_dir, runtime, store) = on_one_thread();
        let writer = &store.writer;
        let ended = super::Drain {
            writer: None,
            weak: std::sync::Arc::downgrade(writer),
            inbox: std::sync::Arc::clone(&writer.inbox),
            ended: true,
        };
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        let event = NewEvent::new(
            SessionRef::parse("agent:main:child", "main").expect("ref"),
            EventKind::Compacted,
            ActorType::System,
            "queued for the next drain",
        );
        let now = Timestamp(1_800_000_000_000);
        {
            // What `submit` does when no drain runs: queue the job, mark a new drain running.
            let mut q = lock(&writer.inbox.queue);
            q.jobs
                .push_back(super::Work::Record(super::Job { event, now, reply }));
            q.draining = true;
        }
        drop(ended);
        // Still waiting for its answer: the ended drain neither took nor failed it.
        let unanswered = matches!(
            answer.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        );
        let left = {
            let mut q = lock(&writer.inbox.queue);
            let left = (q.jobs.len(), q.draining, unanswered);
            q.jobs.clear();
            q.draining = false;
            left
        };
        assert_eq!(
            left,
            (1, true, true),
            "(queued, draining, its caller still waiting) after the ended drain's drop"
        );
        runtime.block_on(store.close());
    }

    /// An event whose recording panics in a batch fails only its own caller: the others of
    /// the batch are recorded, each alone. The panic failed the whole batch.
    #[test]
    fn a_panic_in_a_batch_fails_only_the_event_that_panicked() {
        let (_dir, runtime, store) = on_one_thread();
        let at = SessionRef::parse("agent:main:child", "main").expect("ref");
        let got: Vec<Result<String, String>> =
            run_batch(&store, &at, &["first", super::PANICS_IN_TESTS, "last"])
                .into_iter()
                .map(|r| {
                    r.map(|rec| rec.event.summary.clone())
                        .map_err(|e| e.to_string())
                })
                .collect();
        assert_eq!(got[0], Ok("first".to_owned()));
        assert_eq!(got[2], Ok("last".to_owned()));
        let err = got[1].as_ref().expect_err("the event that panicked fails");
        assert!(err.contains("record panicked"), "{err}");
        runtime.block_on(store.close());
    }

    /// A group commit that panics in its commit fails the callers of its batch with the
    /// panic's message and the file, and the drain goes on with the jobs queued behind it: the
    /// panic unwound out of the drain, which failed every queued job, other callers' writes
    /// included, each told only that the writer stopped.
    #[test]
    fn a_group_commit_that_panics_fails_only_its_batch() {
        let (dir, runtime, store) = on_one_thread();
        let at = SessionRef::parse("agent:main:child", "main").expect("ref");
        let now = Timestamp(1_800_000_000_000);
        let file = dir.path().join("state.redb").display().to_string();
        for answer in run_batch(
            &store,
            &at,
            &["first", super::COMMIT_PANICS_IN_TESTS, "last"],
        ) {
            let err = answer.expect_err("nothing of the batch was committed");
            let chain = awareness_core::error::ErrorChain(&err).to_string();
            assert!(
                chain.contains(&format!("{file}: record (a group commit) panicked"))
                    && chain.contains("the commit's own panic"),
                "{chain}"
            );
        }
        let ok = NewEvent::new(at.clone(), EventKind::Compacted, ActorType::System, "after");
        let rec = runtime
            .block_on(store.record(ok, now))
            .expect("the next recording is made");
        assert_eq!(rec.event.summary, "after");
        let log = runtime
            .block_on(store.events_after(awareness_core::Sequence(0), 10))
            .expect("log");
        let summaries: Vec<&str> = log.iter().map(|e| e.summary.as_str()).collect();
        assert_eq!(
            summaries,
            ["after"],
            "nothing of the failed batch was committed"
        );
        runtime.block_on(store.close());
    }

    /// A group commit whose commit fails fails its batch's callers, and latches the handle
    /// with that failure as its cause: the next write says to reopen the file and repeats it.
    /// (Only the commit itself noted the failure there; a mutation review removed that and
    /// every test passed: the failures the process tests make come inside the transaction.)
    /// The failed commit is not counted among the handle's write transactions. (What the
    /// mutation did: counted before its failure was known; review of stop 65, RB21.)
    #[test]
    fn a_group_commit_that_fails_latches_the_handle_with_its_cause() {
        let (_dir, runtime, store) = on_one_thread();
        let at = SessionRef::parse("agent:main:child", "main").expect("ref");
        let before = store.write_transactions();
        store
            .writer
            .shared()
            .commit_fails
            .store(true, std::sync::atomic::Ordering::Release);
        for answer in run_batch(&store, &at, &["first", "second"]) {
            let err = answer.expect_err("not committed");
            let chain = awareness_core::error::ErrorChain(&err).to_string();
            assert!(chain.contains("the commit's own failure"), "{chain}");
        }
        assert_eq!(
            store.write_transactions(),
            before,
            "a failed commit is not counted as committed"
        );
        latched_saying(&runtime, store, at, "the commit's own failure");
    }

    /// A check after a panicked group commit that panics too (redb's lock poisoned by the
    /// first panic, say) is caught, and latches the handle: the batch's callers are answered,
    /// the drain goes on, and the next write says to reopen the file. The second panic
    /// unwound out of the drain, failing every queued job, and left the handle unlatched.
    #[test]
    fn a_check_that_panics_after_a_panicked_commit_latches_the_handle() {
        let (_dir, runtime, store, at) = the_check_panicking();
        for answer in run_batch(&store, &at, &[super::COMMIT_PANICS_IN_TESTS, "x"]) {
            answer.expect_err("not committed");
        }
        latched_saying(&runtime, store, at, "the check's own panic");
    }

    /// A write that panics is checked as every failed write is, for a failure redb latched
    /// (here the check itself panics, as when redb's lock is poisoned, which latches the
    /// handle): the next write says to reopen the file. (The check left out of the panic path,
    /// a mutation every test passed, the handle was not marked until a later write failed:
    /// review of stop 61.)
    #[test]
    fn a_write_that_panics_is_checked_for_a_latched_failure() {
        let (_dir, runtime, store, at) = the_check_panicking();
        runtime
            .block_on(store.writer.write("a write", |_| -> Result<(), _> {
                panic!("the write's own panic")
            }))
            .expect_err("the write that panicked fails");
        latched_saying(&runtime, store, at, "the check's own panic");
    }

    /// Checks that the next recording on `store` is refused, saying to reopen the file and
    /// repeating `cause`; then closes the store.
    fn latched_saying(
        runtime: &tokio::runtime::Runtime,
        store: crate::RedbStore,
        at: SessionRef,
        cause: &str,
    ) {
        let ok = NewEvent::new(at, EventKind::Compacted, ActorType::System, "after");
        let err = runtime
            .block_on(store.record(ok, Timestamp(1_800_000_000_000)))
            .expect_err("the handle is latched");
        let chain = awareness_core::error::ErrorChain(&err).to_string();
        assert!(
            chain.contains("reopened") && chain.contains(cause),
            "{chain}"
        );
        runtime.block_on(store.close());
    }

    /// A lone recording that panics, and a write that panics, each fail their own caller with
    /// an error naming the file, and the drain goes on: a panic there ended the drain, whose
    /// queued jobs then all failed, and its own caller was told only that the writer stopped.
    #[test]
    fn a_lone_write_that_panics_fails_only_its_caller() {
        let (dir, runtime, store) = on_one_thread();
        let at = SessionRef::parse("agent:main:child", "main").expect("ref");
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        let event = NewEvent::new(
            at.clone(),
            EventKind::Compacted,
            ActorType::System,
            super::PANICS_IN_TESTS,
        );
        let now = Timestamp(1_800_000_000_000);
        let answers = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.writer.run(vec![super::Job { event, now, reply }])
        }))
        .expect("a lone recording that panics is answered");
        super::answer(answers);
        let err = answer
            .try_recv()
            .expect("answered")
            .expect_err("the recording that panicked fails");
        let file = dir.path().join("state.redb").display().to_string();
        assert!(err.to_string().contains(&file), "{err}");

        let err = runtime
            .block_on(store.writer.write("a write", |_| -> Result<(), _> {
                panic!("the write's own panic")
            }))
            .expect_err("the write that panicked fails");
        let chain = awareness_core::error::ErrorChain(&err).to_string();
        assert!(
            chain.contains(&format!("{file}: a write panicked"))
                && chain.contains("the write's own panic"),
            "{chain}"
        );
        let ok = NewEvent::new(at, EventKind::Compacted, ActorType::System, "after");
        let rec = runtime
            .block_on(store.record(ok, now))
            .expect("the next recording is made");
        assert_eq!(rec.event.summary, "after");
        runtime.block_on(store.close());
    }
}
