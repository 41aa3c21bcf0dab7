//! A ready, in-process [`SystemEventQueue`].

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use awareness_core::SessionKey;

use crate::config::ConfigError;
use crate::ports::{QueuedEntry, SystemEventQueue};

/// Per-session queues in memory.
///
/// - An entry whose text and context key equal a queued one is dropped (so 20 identical notices
///   are one line).
/// - With a capacity, a full queue evicts its oldest entry that is **not** a session-state
///   notice; a session-state notice is never evicted (the queue grows past its capacity rather
///   than lose one).
#[derive(Debug, Default)]
pub struct InMemoryQueue {
    capacity: Option<usize>,
    queues: Mutex<HashMap<SessionKey, VecDeque<QueuedEntry>>>,
}

impl InMemoryQueue {
    /// An unbounded queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// A queue that keeps at most `capacity` entries per session (session-state notices
    /// excepted, see the type's docs).
    ///
    /// # Panics
    ///
    /// On a capacity of 0, with the [`ConfigError`]'s text. A capacity that comes from a user
    /// goes through [`InMemoryQueue::try_with_capacity`].
    pub fn with_capacity(capacity: usize) -> Self {
        Self::try_with_capacity(capacity).unwrap_or_else(|e| panic!("invalid queue capacity: {e}"))
    }

    /// [`InMemoryQueue::with_capacity`], or a [`ConfigError`] for a capacity of 0 (a queue that
    /// keeps no entry would still keep the newest one, and every session-state notice).
    pub fn try_with_capacity(capacity: usize) -> Result<Self, ConfigError> {
        crate::config::at_least_one(
            "InMemoryQueue.capacity",
            u64::try_from(capacity).unwrap_or(u64::MAX),
            "it must be at least 1: it is how many entries a session's queue keeps",
        )?;
        Ok(Self {
            capacity: Some(capacity),
            queues: Mutex::default(),
        })
    }

    /// Forgets every queue, as a process restart would.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionKey, VecDeque<QueuedEntry>>> {
        self.queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl SystemEventQueue for InMemoryQueue {
    fn enqueue(&self, session: &SessionKey, entry: QueuedEntry) -> bool {
        let mut g = self.lock();
        let q = g.entry(session.clone()).or_default();
        if q.contains(&entry) {
            return false;
        }
        if let Some(cap) = self.capacity {
            while q.len() >= cap {
                let Some(victim) = q.iter().position(|e| !e.is_session_state()) else {
                    break; // only session-state notices left: never evict them
                };
                q.remove(victim);
            }
        }
        q.push_back(entry);
        true
    }

    fn drain(&self, session: &SessionKey) -> Vec<QueuedEntry> {
        self.lock()
            .remove(session)
            .map(Vec::from)
            .unwrap_or_default()
    }

    fn peek(&self, session: &SessionKey) -> Vec<QueuedEntry> {
        self.lock()
            .get(session)
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn remove(&self, session: &SessionKey, entry: &QueuedEntry) -> bool {
        let mut g = self.lock();
        let Some(q) = g.get_mut(session) else {
            return false;
        };
        let Some(at) = q.iter().position(|e| e == entry) else {
            return false;
        };
        q.remove(at);
        if q.is_empty() {
            g.remove(session);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SessionKey {
        SessionKey::new("agent:main:main").unwrap()
    }
    fn plain(t: &str) -> QueuedEntry {
        QueuedEntry {
            text: t.into(),
            context_key: None,
        }
    }
    fn notice(t: &str) -> QueuedEntry {
        QueuedEntry {
            text: t.into(),
            context_key: Some("session-state:61".into()),
        }
    }

    #[test]
    fn duplicates_are_dropped_by_text_and_context_key() {
        let q = InMemoryQueue::new();
        assert!(q.enqueue(&key(), notice("n")));
        assert!(!q.enqueue(&key(), notice("n")));
        assert!(
            q.enqueue(&key(), plain("n")),
            "another context key is another entry"
        );
        assert_eq!(q.peek(&key()).len(), 2);
        assert!(q.remove(&key(), &notice("n")));
        assert!(!q.remove(&key(), &notice("n")), "already gone");
        assert_eq!(q.peek(&key()), vec![plain("n")], "the other entry stays");
        assert!(q.enqueue(&key(), notice("n")));
        assert_eq!(q.drain(&key()).len(), 2);
        assert!(q.drain(&key()).is_empty());
    }

    #[test]
    fn session_state_notices_are_never_evicted() {
        let q = InMemoryQueue::with_capacity(2);
        q.enqueue(&key(), notice("n1"));
        q.enqueue(&key(), plain("p1"));
        q.enqueue(&key(), plain("p2"));
        let left: Vec<String> = q.peek(&key()).into_iter().map(|e| e.text).collect();
        assert_eq!(
            left,
            vec!["n1", "p2"],
            "the plain entry went, the notice stayed"
        );
        q.enqueue(&key(), notice("n2"));
        q.enqueue(&key(), notice("n3"));
        let left: Vec<String> = q.peek(&key()).into_iter().map(|e| e.text).collect();
        assert_eq!(
            left,
            vec!["n1", "n2", "n3"],
            "over capacity rather than lose a notice"
        );
    }

    /// Removing a line from a session that has nothing queued (never had, or its last line went)
    /// removes nothing and answers `false`. (What the mutation did: a session without a queue
    /// answered `true`, a removal that did not happen, after the last line of a queue went;
    /// review of stop 67, GB15.)
    #[test]
    fn removing_from_a_session_with_nothing_queued_answers_false() {
        let q = InMemoryQueue::new();
        assert!(!q.remove(&key(), &plain("p")), "nothing was ever queued");
        assert!(q.enqueue(&key(), plain("p")));
        assert!(q.remove(&key(), &plain("p")), "the line was there");
        assert!(
            !q.remove(&key(), &plain("p")),
            "the last line went with its queue"
        );
    }

    /// A full queue evicts its oldest plain line, not its newest; a line with a context key of
    /// another kind than `session-state:` is plain. (What the mutations did: the last plain line
    /// evicted, the session read the stale lines and lost the latest; review of stop 63, W08. And
    /// every line with a context key taken for a notice, never evicted, the queue grew past its
    /// capacity; review of stop 65, GA38.)
    #[test]
    fn a_full_queue_evicts_its_oldest_plain_entry() {
        let q = InMemoryQueue::with_capacity(3);
        for t in ["p1", "p2", "p3", "p4"] {
            assert!(q.enqueue(&key(), plain(t)));
        }
        let left: Vec<String> = q.peek(&key()).into_iter().map(|e| e.text).collect();
        assert_eq!(left, vec!["p2", "p3", "p4"], "the oldest line went");
        let keyed = |t: &str| QueuedEntry {
            text: t.into(),
            context_key: Some(format!("cron:{t}")),
        };
        assert!(!keyed("c1").is_session_state());
        let q = InMemoryQueue::with_capacity(2);
        for t in ["c1", "c2", "c3"] {
            assert!(q.enqueue(&key(), keyed(t)));
        }
        let left: Vec<String> = q.peek(&key()).into_iter().map(|e| e.text).collect();
        assert_eq!(left, vec!["c2", "c3"], "the oldest keyed line went");
    }

    /// A queue of capacity 1 keeps one plain line per session, the newest. (What the mutation
    /// did: capacities under 2 raised to 2, a gateway that asked for one line per session got two,
    /// the stale one read with the new; review of stop 68, GD35.)
    #[test]
    fn a_queue_of_capacity_one_keeps_the_newest_line() {
        let q = InMemoryQueue::with_capacity(1);
        assert!(q.enqueue(&key(), plain("p1")));
        assert!(q.enqueue(&key(), plain("p2")));
        assert_eq!(q.peek(&key()), vec![plain("p2")], "only the newest line");
    }

    /// A line already queued in a full queue is dropped as a duplicate before anything is
    /// evicted for it: the queue keeps every line it had. (What the mutation did: the oldest
    /// plain line was evicted to make room, then the new one found a duplicate, and a repeated
    /// notice cost the session an unread line; review of stop 70, GE03.)
    #[test]
    fn a_duplicate_in_a_full_queue_evicts_nothing() {
        let q = InMemoryQueue::with_capacity(2);
        assert!(q.enqueue(&key(), plain("p1")));
        assert!(q.enqueue(&key(), plain("p2")));
        assert!(!q.enqueue(&key(), plain("p2")), "a duplicate");
        assert_eq!(
            q.peek(&key()),
            vec![plain("p1"), plain("p2")],
            "nothing was evicted for the duplicate"
        );
    }

    /// An unbounded queue keeps every line, however many. (What the mutation did: `new` made a
    /// queue of 64, and the 65th line evicted the oldest; review of stop 70, GE04.)
    #[test]
    fn an_unbounded_queue_keeps_every_line() {
        let q = InMemoryQueue::new();
        for n in 0..200 {
            assert!(q.enqueue(&key(), plain(&format!("p{n}"))));
        }
        let left = q.peek(&key());
        assert_eq!(left.len(), 200, "every line is kept");
        assert_eq!(left[0], plain("p0"), "the oldest too");
    }

    /// A plain line that comes to a queue full of session-state notices is queued, past the
    /// capacity (nothing can be evicted for it): the newest line is always kept. (What the
    /// mutation did: the plain line was dropped and `enqueue` answered `false`, as for a
    /// duplicate; review of stop 70, GE06.)
    #[test]
    fn a_plain_line_to_a_queue_full_of_notices_is_kept() {
        let q = InMemoryQueue::with_capacity(1);
        assert!(q.enqueue(&key(), notice("n1")));
        assert!(q.enqueue(&key(), plain("p1")), "the plain line is queued");
        assert_eq!(
            q.peek(&key()),
            vec![notice("n1"), plain("p1")],
            "the notice stays and the newest line is kept"
        );
    }

    /// Removing a line keeps the others in their order, oldest first, as the port says. (What
    /// the mutation did: the newest line was moved into the removed one's place, and the turn
    /// read the session's lines out of order; review of stop 71, GF24.)
    #[test]
    fn removing_a_line_keeps_the_others_in_order() {
        let q = InMemoryQueue::new();
        for t in ["p1", "p2", "p3"] {
            assert!(q.enqueue(&key(), plain(t)));
        }
        assert!(q.remove(&key(), &plain("p1")));
        assert_eq!(
            q.peek(&key()),
            vec![plain("p2"), plain("p3")],
            "the others stay in order"
        );
    }

    /// Evicting a plain line from a full queue keeps the session-state notices before it in
    /// their order. (What the mutation did: the oldest notice was moved into the evicted line's
    /// place, and the session read its state notices out of order; review of stop 71, GF25.)
    #[test]
    fn an_eviction_keeps_the_notices_in_order() {
        let q = InMemoryQueue::with_capacity(3);
        for e in [notice("n1"), notice("n2"), plain("p1"), plain("p2")] {
            assert!(q.enqueue(&key(), e));
        }
        assert_eq!(
            q.peek(&key()),
            vec![notice("n1"), notice("n2"), plain("p2")],
            "the oldest plain line went, the rest kept their order"
        );
    }
}
