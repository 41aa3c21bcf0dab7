//! The queue of group commit (docs/decisions/0005), shared by the durable stores that batch
//! recordings: a caller queues its job, then either a writer takes it into a batch, or the
//! caller takes the queue itself once it may write. [`Queued`] is the caller's claim on its
//! job: dropped while the job still waits (the caller gave up), it takes the job out, so that
//! no later batch commits an event whose caller gave up on it.
//!
//! ```
//! use awareness_core::queue::{Job, Queue, Queued};
//!
//! struct Recording { id: u64, summary: &'static str }
//! impl Job for Recording {
//!     fn id(&self) -> u64 { self.id }
//! }
//!
//! let queue = Queue::default();
//! queue.push(Recording { id: 1, summary: "first" });
//! let gone = Queued::new(&queue, 2);
//! queue.push(Recording { id: 2, summary: "given up" });
//! drop(gone); // its caller gave up while it waited: it leaves the queue
//! queue.push(Recording { id: 3, summary: "third" });
//! let batch = queue.take(64);
//! let summaries: Vec<_> = batch.iter().map(|r| r.summary).collect();
//! assert_eq!(summaries, ["first", "third"]);
//! ```

use std::collections::VecDeque;

/// A queued job, told from the others by a number its store gives it.
pub trait Job {
    /// The job's number, unique among those of its queue.
    fn id(&self) -> u64;
}

/// The jobs waiting for a writer, oldest first.
pub struct Queue<J> {
    jobs: std::sync::Mutex<VecDeque<J>>,
}

impl<J> Default for Queue<J> {
    fn default() -> Self {
        Self {
            jobs: std::sync::Mutex::new(VecDeque::new()),
        }
    }
}

impl<J> std::fmt::Debug for Queue<J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("waiting", &self.lock().len())
            .finish()
    }
}

impl<J> Queue<J> {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<J>> {
        // A panic elsewhere while the lock was held leaves the queue whole: every change
        // here is one call on the deque.
        self.jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `job` last.
    pub fn push(&self, job: J) {
        self.lock().push_back(job);
    }

    /// Takes up to `max` jobs, oldest first.
    pub fn take(&self, max: usize) -> Vec<J> {
        let mut q = self.lock();
        let n = q.len().min(max);
        q.drain(..n).collect()
    }
}

impl<J: Job> Queue<J> {
    /// Removes the job `id` if it is still queued.
    fn remove(&self, id: u64) {
        self.lock().retain(|j| j.id() != id);
    }
}

/// A caller's claim on its queued job (see the module's docs).
pub struct Queued<'q, J: Job> {
    queue: &'q Queue<J>,
    id: u64,
    waiting: bool,
}

impl<'q, J: Job> Queued<'q, J> {
    /// The claim on the job `id` of `queue`, made before the job is pushed (or just after,
    /// with no await between).
    pub fn new(queue: &'q Queue<J>, id: u64) -> Self {
        Self {
            queue,
            id,
            waiting: true,
        }
    }

    /// The job has left the queue (a writer took it): nothing to undo any more.
    pub fn taken(&mut self) {
        self.waiting = false;
    }
}

impl<J: Job> Drop for Queued<'_, J> {
    fn drop(&mut self) {
        if self.waiting {
            self.queue.remove(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Numbered(u64);

    impl Job for Numbered {
        fn id(&self) -> u64 {
            self.0
        }
    }

    /// With more jobs waiting than a batch takes, the oldest go first, the rest after in their
    /// order: a caller that queued first is not left behind later ones for as long as they keep
    /// coming. (The newest first passed every test: the doc example takes them all at once;
    /// review of stop 60.) A batch of at most none takes none (review of stop 65, CO07: at
    /// least one taken, though no store asks for none).
    #[test]
    fn a_batch_takes_the_oldest_jobs_first() {
        let queue = Queue::default();
        for id in 1..=5 {
            queue.push(Numbered(id));
        }
        let ids = |jobs: Vec<Numbered>| jobs.into_iter().map(|j| j.0).collect::<Vec<_>>();
        assert_eq!(ids(queue.take(2)), [1, 2]);
        assert_eq!(ids(queue.take(9)), [3, 4, 5]);
        assert!(queue.take(9).is_empty());
        queue.push(Numbered(6));
        assert!(queue.take(0).is_empty(), "a batch of none takes none");
    }

    /// A caller that gives up takes only its own job out of the queue: the jobs queued after it
    /// stay, in their order. (What the mutation did: `retain(|j| j.id() < id)`, a given-up job
    /// took every job queued after it out with it, and those callers' events were never
    /// committed; only store-sqlite's conformance suite caught it; review of stop 65, CO12.)
    #[test]
    fn a_given_up_job_takes_out_only_itself() {
        let queue = Queue::default();
        queue.push(Numbered(1));
        let gone = Queued::new(&queue, 2);
        queue.push(Numbered(2));
        queue.push(Numbered(3));
        queue.push(Numbered(4));
        drop(gone);
        let ids: Vec<u64> = queue.take(9).into_iter().map(|j| j.0).collect();
        assert_eq!(ids, [1, 3, 4], "the jobs queued after a given-up one stay");
    }
}
