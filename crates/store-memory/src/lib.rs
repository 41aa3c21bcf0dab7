//! # store-memory
//!
//! The in-memory [`EventStore`], [`CursorStore`] and [`awareness_core::UpstreamStore`]: the
//! reference implementation of the storage contract, for tests and for embedding a gateway that
//! needs no durability. Everything is lost when the process ends; pick `store-sqlite`,
//! `store-redb` or `store-postgres` to keep it.
//!
//! It keeps every protocol decision in `awareness-core` and only persists the result, under one
//! short-held lock. Pages return shared events (`Arc<Event>`), never deep copies.
//!
//! ```
//! use awareness_core::{ActorType, AwarenessStoreExt, CursorStore, EventKind, EventStore,
//!     NewEvent, SessionRef, Sequence, Timestamp, WatcherKey};
//! use store_memory::MemoryStore;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let now = Timestamp(1_800_000_000_000);
//! let child = SessionRef::parse("agent:main:subagent:child", "main")?;
//! let manager = WatcherKey::parse("agent:main:main")?;
//! store.watch(&manager, &child, now).await?;
//! let rec = store
//!     .record(NewEvent::new(child.clone(), EventKind::HumanDirectMessage, ActorType::Human,
//!         "human message via telegram"), now)
//!     .await?;
//! assert_eq!(rec.notices.len(), 1);
//! let status = store.session_status(&child, Some(Sequence(0)), None).await?;
//! assert_eq!(status.state_version, rec.event.sequence);
//! assert_eq!(status.state_changes.unwrap().events.len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod upstream;

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use awareness_core::reconcile::ChangesPage;
use awareness_core::{
    AckTarget, AgentId, Cursor, CursorFilter, CursorKey, CursorStore, Event, EventStore, Head,
    LogStats, NewEvent, Notice, PruneStep, Recorded, Sequence, SessionKey, SessionRef, StoreError,
    Timestamp, WatcherKey, async_trait, protocol, reconcile, retention,
};

/// The last sequence an event can get here: one below `u64::MAX`, so that the number after
/// every event exists (a session's `earliestAvailableSequence` is its head's next when nothing
/// is retained, and `Sequence::next` stops at `u64::MAX`). Decision 0025.
pub const LAST_SEQUENCE: u64 = u64::MAX - 1;

/// The in-memory store. Cheap to clone handles are made with `Arc<MemoryStore>`.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    /// Callers blocked on `inner` right now (a caller counts itself only when `try_lock` found it
    /// held, so the uncontended path pays nothing), so that a
    /// pruning pass lets them go before its next chunk: the standard mutex is not fair, and a
    /// pass that takes it again right after letting it go would keep a recording waiting for the
    /// whole pass instead of one chunk.
    blocked: AtomicUsize,
}

/// Rows a pruning chunk deletes under one hold of the lock: a recording that arrives meanwhile
/// waits for one such step, not for the whole chunk (a pass of five chunks of 2,000 rows took
/// 14 ms in `prune/60k_to_50k`).
const PRUNE_STEP_ROWS: usize = 256;
/// Rows the age and idle steps of pruning look at under one hold of the lock: their victims are
/// not in the order of any index, so a step that finds few may look at every row.
const PRUNE_SCAN_ROWS: usize = 1_024;

/// How long a pruning chunk waits for callers blocked on the lock to take it first.
const MAINTENANCE_DEFERS_AT_MOST: Duration = Duration::from_millis(2);

/// FxHash (the rustc hasher): several times cheaper than SipHash on short keys. The keys are
/// session keys of one gateway, not attacker-chosen bulk input, and the map sizes are bounded by
/// retention, so collision flooding is not a concern for this in-process store.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let v = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(i)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, i: usize) {
        self.0 = (self.0.rotate_left(5) ^ i as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FxBuild = std::hash::BuildHasherDefault<FxHasher>;
type FastMap<K, V> = HashMap<K, V, FxBuild>;

#[derive(Debug, Default)]
struct Inner {
    last_sequence: u64,
    events: BTreeMap<Sequence, Arc<Event>>,
    /// Per ref: its head and its retained events (one hash lookup per record).
    sessions: FastMap<SessionRef, RefState>,
    dedupe: FastMap<String, Sequence>,
    cursors: BTreeMap<CursorKey, Cursor>,
    by_target: FastMap<SessionKey, BTreeSet<WatcherKey>>,
    /// The keys of each watcher's cursors (a turn lists its watcher's cursors: without this it
    /// would look at every cursor of the store).
    by_watcher: FastMap<SessionKey, BTreeSet<CursorKey>>,
    /// Upstream links of adopted sessions, by ref (see `upstream.rs`).
    links: BTreeMap<SessionRef, awareness_core::UpstreamLink>,
}

#[derive(Debug)]
struct RefState {
    /// `None` only once [`MemoryStore::delete_head_row`] took it: the events stay, as in a
    /// durable store whose head row was deleted by hand.
    head: Option<Head>,
    events: BTreeMap<Sequence, Arc<Event>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// deletes one event row and nothing else (no watermark, no head change), as an operator
    /// repairing a store by hand would. Returns whether the row existed. The conformance suite uses
    /// it to prove that history gaps come only from pruning.
    #[doc(hidden)]
    pub fn delete_event_row(&self, sequence: Sequence) -> bool {
        self.lock().remove_event(sequence).is_some()
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// deletes one session's head, touching nothing else: its events stay (a page of its changes
    /// lists them, deleting the session deletes them) and the cursors on the session stay, as a
    /// durable store whose head row was deleted by hand is left. Returns whether the head existed.
    /// The conformance suite uses it to check that pruning never creates a head.
    #[doc(hidden)]
    pub fn delete_head_row(&self, session: &SessionRef) -> bool {
        self.lock()
            .sessions
            .get_mut(session)
            .and_then(|st| st.head.take())
            .is_some()
    }

    /// Test support, not part of the API (hidden from the docs; it may change or go at any time):
    /// moves the sequence counter forward so that exactly `left` more sequences can be handed out
    /// (to new events, or to dedupe hits, which consume one too) before it reaches
    /// [`LAST_SEQUENCE`]; touches nothing else. Returns whether it could: `false` when the counter
    /// is already past that point (it never goes back). The conformance suite uses it to check what
    /// recording does once the counter is at its end.
    #[doc(hidden)]
    pub fn leave_sequences(&self, left: u64) -> bool {
        let mut g = self.lock();
        let Some(at) = LAST_SEQUENCE.checked_sub(left) else {
            return false;
        };
        if g.last_sequence > at {
            return false;
        }
        g.last_sequence = at;
        true
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied operation behind: every
        // operation computes its changes first and applies them without fallible steps.
        match self.inner.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.blocked.fetch_add(1, Ordering::AcqRel);
                let g = self
                    .inner
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                self.blocked.fetch_sub(1, Ordering::AcqRel);
                g
            }
        }
    }

    /// Before a step of a pruning chunk takes the lock: callers already blocked on it go first
    /// (for at most [`MAINTENANCE_DEFERS_AT_MOST`], so a steady stream of them cannot stall the
    /// pass). It lets its executor run other tasks while it waits, where it spun its thread,
    /// holding up a runtime worker for up to that long per step: pruning is maintenance, off
    /// the hot path.
    async fn defer_to_blocked(&self) {
        let started = Instant::now();
        while self.blocked.load(Ordering::Acquire) > 0
            && started.elapsed() < MAINTENANCE_DEFERS_AT_MOST
        {
            YieldOnce(false).await;
        }
    }
}

/// One step of a pruning scan: the keys after `after`, up to `upto` when given, whose values
/// are `due`, at most `want` of them, looking at no more than [`PRUNE_SCAN_ROWS`] rows; moves
/// `after` to the last row it looked at. Also says whether rows remain to look at.
fn scan_step<K: Ord + Clone, V>(
    map: &BTreeMap<K, V>,
    after: &mut Option<K>,
    upto: Option<K>,
    want: usize,
    due: impl Fn(&V) -> bool,
) -> (Vec<K>, bool) {
    let from = after.take().map_or(Bound::Unbounded, Bound::Excluded);
    let mut victims = Vec::new();
    let rows = map.range((from, upto.map_or(Bound::Unbounded, Bound::Included)));
    for (looked, (k, v)) in rows.enumerate() {
        if due(v) {
            victims.push(k.clone());
        }
        if victims.len() == want || looked + 1 == PRUNE_SCAN_ROWS {
            *after = Some(k.clone());
            return (victims, true);
        }
    }
    (victims, false)
}

impl Inner {
    fn key(watcher: &WatcherKey, target: &SessionKey) -> CursorKey {
        CursorKey {
            watcher: watcher.clone(),
            target: target.clone(),
        }
    }

    fn put_cursor(&mut self, c: Cursor) {
        let key = c.key();
        // An update leaves the indexes as they are.
        if self.cursors.insert(key.clone(), c).is_none() {
            self.by_target
                .entry(key.target.clone())
                .or_default()
                .insert(key.watcher.clone());
            self.by_watcher
                .entry(key.watcher.session_key().clone())
                .or_default()
                .insert(key);
        }
    }

    fn remove_cursor(&mut self, key: &CursorKey) -> bool {
        if self.cursors.remove(key).is_none() {
            return false;
        }
        if let Some(set) = self.by_target.get_mut(&key.target) {
            set.remove(&key.watcher);
            if set.is_empty() {
                self.by_target.remove(&key.target);
            }
        }
        let watcher = key.watcher.session_key();
        if let Some(set) = self.by_watcher.get_mut(watcher) {
            set.remove(key);
            if set.is_empty() {
                self.by_watcher.remove(watcher);
            }
        }
        true
    }

    /// The cursors of `watcher`, by target.
    fn cursors_of(&self, watcher: &SessionKey) -> impl Iterator<Item = &Cursor> {
        self.by_watcher
            .get(watcher)
            .into_iter()
            .flatten()
            .filter_map(|k| self.cursors.get(k))
    }

    fn cursors_on(&self, target: &SessionKey) -> Vec<Cursor> {
        let Some(set) = self.by_target.get(target) else {
            return Vec::new();
        };
        set.iter()
            .filter_map(|w| self.cursors.get(&Self::key(w, target)).cloned())
            .collect()
    }

    fn remove_event(&mut self, seq: Sequence) -> Option<Arc<Event>> {
        let ev = self.events.remove(&seq)?;
        if let Some(st) = self.sessions.get_mut(&ev.session_ref()) {
            st.events.remove(&seq);
        }
        if let Some(k) = &ev.dedupe_key
            && self.dedupe.get(k) == Some(&seq)
        {
            self.dedupe.remove(k);
        }
        Some(ev)
    }

    /// Stamps watermarks of existing heads at `now`, then deletes the victims, which it returns
    /// (for the caller to free once it has let the lock go).
    fn prune_events(&mut self, victims: &[Sequence], now: Timestamp) -> Vec<Arc<Event>> {
        let refs: Vec<(SessionRef, Sequence)> = victims
            .iter()
            .filter_map(|s| self.events.get(s).map(|e| (e.session_ref(), *s)))
            .collect();
        for (r, s) in retention::watermarks(refs.iter().map(|(r, s)| (r, *s))) {
            // Pruning raises the heads there are and never creates one.
            if let Some(head) = self.sessions.get_mut(&r).and_then(|st| st.head.as_mut()) {
                *head = retention::stamp(head, s, now);
            }
        }
        victims
            .iter()
            .filter_map(|s| self.remove_event(*s))
            .collect()
    }
}

/// Where a chunk's scan goes on at its next step.
#[derive(Default)]
struct Resume {
    event: Option<Sequence>,
    /// The last event when the age scan began: it stops there, since a scan that went on over
    /// the events recorded during the chunk could chase a log that grows faster than it looks,
    /// and never end. Those events are seldom due (their time is at most a day back, where a
    /// recording clamps it); one that is, under a retention shorter than a day, waits for the
    /// next pass.
    last_event: Option<Sequence>,
    cursor: Option<CursorKey>,
}

impl MemoryStore {
    /// One step of a pruning chunk, under one hold of the lock: the rows it deleted, and
    /// whether more may be due. The deleted events are freed after the lock is let go: freeing
    /// them is much of a step's work.
    fn prune_step(
        &self,
        step: &PruneStep,
        want: usize,
        now: Timestamp,
        resume: &mut Resume,
    ) -> (usize, bool) {
        let mut g = self.lock();
        let (victims, more) = match *step {
            PruneStep::Age { cutoff } => {
                let Some(last) = resume
                    .last_event
                    .or_else(|| g.events.keys().next_back().copied())
                else {
                    return (0, false);
                };
                resume.last_event = Some(last);
                scan_step(&g.events, &mut resume.event, Some(last), want, |e| {
                    e.occurred_at < cutoff
                })
            }
            PruneStep::RowCap { max_rows: keep } => {
                let n = retention::row_cap_victims(g.events.len() as u64, keep, want);
                (g.events.keys().take(n).copied().collect(), n == want)
            }
            // A cursor created meanwhile whose key sorts before where the scan goes on, and
            // that is idle already (its caller's clock far behind), waits for the next pass.
            PruneStep::Cursors { cutoff } => {
                let (victims, more) = scan_step(&g.cursors, &mut resume.cursor, None, want, |c| {
                    c.updated_at < cutoff
                });
                return (victims.iter().filter(|k| g.remove_cursor(k)).count(), more);
            }
        };
        let freed = g.prune_events(&victims, now);
        drop(g);
        let gone = freed.len();
        drop(freed);
        (gone, more)
    }
}

/// A future that lets its executor run other tasks once, whatever the runtime.
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            std::task::Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }
}

#[async_trait]
impl EventStore for MemoryStore {
    async fn record(&self, mut event: NewEvent, now: Timestamp) -> Result<Recorded, StoreError> {
        event.validate()?;
        let mut g = self.lock();
        // A dedupe hit consumes its number too: at the end, it is refused as well.
        let next = Some(g.last_sequence)
            .filter(|&last| last < LAST_SEQUENCE)
            .map(|last| last + 1)
            .ok_or_else(|| StoreError::counter_at_end(g.last_sequence, LAST_SEQUENCE, None))?;
        g.last_sequence = next;
        let seq = Sequence(next);
        if let Some(key) = &event.dedupe_key
            && let Some(existing) = g.dedupe.get(key).and_then(|s| g.events.get(s))
        {
            return Ok(Recorded {
                event: Arc::clone(existing),
                deduplicated: true,
                notices: Vec::new(),
            });
        }
        let named = std::mem::take(&mut event.watchers);
        let stored = Arc::new(event.into_event(seq, now));
        let r = stored.session_ref();
        let existing = g.cursors_on(&stored.session_key);
        let effects = protocol::on_event(&stored, &named, &existing, now);
        if let Some(k) = &stored.dedupe_key {
            g.dedupe.insert(k.clone(), seq);
        }
        g.events.insert(seq, Arc::clone(&stored));
        let st = match g.sessions.entry(r) {
            Entry::Occupied(o) => {
                let st = o.into_mut();
                st.head = Some(protocol::head_after(st.head.as_ref(), &stored, now));
                st
            }
            Entry::Vacant(v) => v.insert(RefState {
                head: Some(protocol::head_after(None, &stored, now)),
                events: BTreeMap::new(),
            }),
        };
        st.events.insert(seq, Arc::clone(&stored));
        for c in effects.upserts {
            g.put_cursor(c);
        }
        Ok(Recorded {
            event: stored,
            deduplicated: false,
            notices: effects.notices,
        })
    }

    async fn changes_since(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError> {
        let limit = reconcile::clamp_limit(Some(limit));
        let g = self.lock();
        let Some(st) = g.sessions.get(session) else {
            return Ok(reconcile::build_page(after, None, None, Vec::new(), limit));
        };
        // Past `after` itself (not from `after.next()`, which stops at `u64::MAX`: an event
        // there would be answered again to a caller already at it).
        let past = (std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded);
        let fetched = st
            .events
            .range(past)
            .take(limit + 1)
            .map(|(_, e)| Arc::clone(e))
            .collect();
        let min = st.events.keys().next().copied();
        Ok(reconcile::build_page(
            after,
            st.head.as_ref(),
            min,
            fetched,
            limit,
        ))
    }

    async fn heads(&self, sessions: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        let g = self.lock();
        Ok(awareness_core::store::distinct_refs(sessions)
            .filter_map(|r| g.sessions.get(r).and_then(|st| st.head.clone()))
            .collect())
    }

    async fn list_heads(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        let g = self.lock();
        let mut out: Vec<Head> = g
            .sessions
            .values()
            .filter_map(|st| st.head.as_ref())
            .filter(|h| agent.is_none_or(|a| *a == h.session.agent_id))
            .cloned()
            .collect();
        out.sort_by(|a, b| a.session.cmp(&b.session));
        Ok(out)
    }

    async fn events_after(
        &self,
        after: Sequence,
        limit: usize,
    ) -> Result<Vec<Arc<Event>>, StoreError> {
        let g = self.lock();
        Ok(g.events
            .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            .take(limit)
            .map(|(_, e)| Arc::clone(e))
            .collect())
    }

    async fn log_stats(&self) -> Result<LogStats, StoreError> {
        let g = self.lock();
        Ok(LogStats {
            rows: g.events.len() as u64,
            min_sequence: g.events.keys().next().copied().unwrap_or_default(),
            max_sequence: g.events.keys().next_back().copied().unwrap_or_default(),
        })
    }

    async fn prune_chunk(
        &self,
        step: &PruneStep,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        // The chunk is deleted in steps of at most `PRUNE_STEP_ROWS` rows, each under one hold
        // of the lock, which is let go (to the callers blocked on it first) between steps; the
        // age and idle steps also let it go after looking at `PRUNE_SCAN_ROWS` rows. Each step
        // stamps the heads of its own victims, so a step is whole by itself. Between steps the
        // task lets its executor run others (a single-threaded runtime's recordings).
        let mut deleted = 0usize;
        let mut resume = Resume::default();
        while deleted < max_rows {
            let want = (max_rows - deleted).min(PRUNE_STEP_ROWS);
            self.defer_to_blocked().await;
            let (gone, more) = self.prune_step(step, want, now, &mut resume);
            deleted += gone;
            if !more {
                break;
            }
            YieldOnce(false).await;
        }
        Ok(deleted as u64)
    }

    async fn delete_session(&self, session: &SessionRef) -> Result<(), StoreError> {
        let mut g = self.lock();
        g.links.remove(session);
        if let Some(st) = g.sessions.remove(session) {
            for s in st.events.keys() {
                g.remove_event(*s);
            }
        }
        // The cursors on the session's key and, when it is the watcher of its key, those it
        // owns: the indexes name them, so the lock is held for them, not for every cursor.
        let key = &session.session_key;
        let mut doomed: Vec<CursorKey> = g
            .by_target
            .get(key)
            .into_iter()
            .flatten()
            .map(|w| CursorKey {
                watcher: w.clone(),
                target: key.clone(),
            })
            .collect();
        if session.is_watcher() {
            doomed.extend(g.by_watcher.get(key).into_iter().flatten().cloned());
        }
        doomed.retain(|k| {
            g.cursors
                .get(k)
                .is_some_and(|c| c.removed_by_delete(session))
        });
        for k in &doomed {
            g.remove_cursor(k);
        }
        Ok(())
    }
}

#[async_trait]
impl CursorStore for MemoryStore {
    async fn watch(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError> {
        protocol::check_watch(watcher.session_key(), &target.session_key)?;
        let mut g = self.lock();
        let key = Inner::key(watcher, &target.session_key);
        let head = g
            .sessions
            .get(target)
            .and_then(|st| st.head.as_ref())
            .map_or(Sequence::ZERO, |h| h.last_sequence);
        let (cursor, write) = protocol::watch(g.cursors.get(&key), watcher, target, head, now);
        if write {
            g.put_cursor(cursor.clone());
        }
        Ok(cursor)
    }

    async fn unwatch(&self, watcher: &WatcherKey, target: &SessionKey) -> Result<bool, StoreError> {
        Ok(self.lock().remove_cursor(&Inner::key(watcher, target)))
    }

    async fn acknowledge(
        &self,
        watcher: &WatcherKey,
        targets: &[AckTarget],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        let mut g = self.lock();
        let mut notices = Vec::new();
        for t in AckTarget::each_once(targets) {
            let Some(c) = g.cursors.get(&Inner::key(watcher, &t.target)) else {
                continue;
            };
            let (write, follow) = t.apply(c, now);
            if let Some(c) = write {
                g.put_cursor(c);
            }
            notices.extend(follow);
        }
        Ok(notices)
    }

    async fn cursor(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError> {
        Ok(self
            .lock()
            .cursors
            .get(&Inner::key(watcher, target))
            .cloned())
    }

    async fn cursors(&self, filter: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        let g = self.lock();
        // Each index gives its cursors in the listing's order (by watcher, then target).
        let keep = |c: &&Cursor| filter.matches(c);
        Ok(match (&filter.watcher, &filter.target) {
            (Some(w), _) => g.cursors_of(w).filter(keep).cloned().collect(),
            (None, Some(t)) => {
                let mut on = g.cursors_on(t);
                on.retain(|c| filter.matches(c));
                on
            }
            (None, None) => g.cursors.values().filter(keep).cloned().collect(),
        })
    }

    async fn refreeze(
        &self,
        keys: &[CursorKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        let mut g = self.lock();
        let mut notices = Vec::new();
        for k in protocol::each_once(keys) {
            let Some(c) = g.cursors.get(k) else { continue };
            if let Some((write, n)) = protocol::refreeze(c, now) {
                if let Some(frozen) = write {
                    g.put_cursor(frozen);
                }
                notices.push(n);
            }
        }
        Ok(notices)
    }

    async fn reset_watcher(&self, watcher: &SessionKey) -> Result<u64, StoreError> {
        let mut g = self.lock();
        let doomed: Vec<CursorKey> = g
            .by_watcher
            .get(watcher)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        Ok(doomed.iter().filter(|k| g.remove_cursor(k)).count() as u64)
    }
}

#[cfg(test)]
mod tests {
    use awareness_core::{ActorType, EventKind, EventStore as _, NewEvent, SessionRef};

    use super::*;

    const T0: Timestamp = Timestamp(1_800_000_000_000);

    /// An age scan stops at the last event there was when it began: events recorded between
    /// its steps (not due: their time is now) are not looked at, so a log that grows faster
    /// than the scan looks cannot keep a chunk from ending.
    #[tokio::test]
    async fn an_age_scan_stops_at_the_last_event_when_it_began() {
        let store = MemoryStore::new();
        let at = SessionRef::parse("agent:main:subagent:s", "main").expect("ref");
        let record = async |n: usize| {
            for _ in 0..n {
                let e = NewEvent::new(at.clone(), EventKind::Compacted, ActorType::System, "x");
                store.record(e, T0).await.expect("record");
            }
        };
        record(PRUNE_SCAN_ROWS + 76).await;
        let step = PruneStep::Age {
            cutoff: Timestamp(T0.millis() - 1),
        };
        let mut resume = Resume::default();
        assert_eq!(store.prune_step(&step, 10, T0, &mut resume), (0, true));
        record(2 * PRUNE_SCAN_ROWS).await;
        assert_eq!(
            store.prune_step(&step, 10, T0, &mut resume),
            (0, false),
            "the scan ends at the event that was last when it began"
        );
    }

    /// A due event that is the last row a step of an age scan looks at is deleted by that step:
    /// the next step goes on after it, so a step that left it would leave it for the whole pass.
    /// (What the mutation did: the step's last looked-at row was not taken as a victim, so an old
    /// event in that place outlived the pass; review of stop 67, MM33.)
    #[tokio::test]
    async fn an_age_step_deletes_the_last_row_it_looks_at() {
        let store = MemoryStore::new();
        let at = SessionRef::parse("agent:main:subagent:s", "main").expect("ref");
        let event = || NewEvent::new(at.clone(), EventKind::Compacted, ActorType::System, "x");
        for _ in 0..PRUNE_SCAN_ROWS - 1 {
            store.record(event(), T0).await.expect("record");
        }
        let old = store
            .record(
                event().with_occurred_at(Timestamp(T0.millis() - 3_600_000)),
                T0,
            )
            .await
            .expect("record")
            .event;
        let step = PruneStep::Age {
            cutoff: Timestamp(T0.millis() - 60_000),
        };
        assert_eq!(
            store.prune_chunk(&step, 10_000, T0).await.expect("prune"),
            1,
            "the old event, the last row of the scan's first step, is deleted"
        );
        assert_eq!(
            store.log_stats().await.expect("stats").rows,
            PRUNE_SCAN_ROWS as u64 - 1
        );
        assert!(
            store
                .events_after(Sequence(old.sequence.0 - 1), 1)
                .await
                .expect("events")
                .first()
                .is_none_or(|e| e.sequence != old.sequence),
            "the old event is gone"
        );
    }

    /// On a single-threaded runtime a chunk lets other tasks run between its steps: a recording
    /// that arrives during a row-cap chunk lands after the chunk's first step, not after the whole
    /// chunk, and the chunk's later steps count it. (What the mutation did: the chunk no longer
    /// yielded between steps, so the recording waited for the whole chunk; review of stop 67,
    /// MM31.)
    #[tokio::test]
    async fn a_recording_during_a_chunk_lands_between_its_steps() {
        let store = MemoryStore::new();
        let at = SessionRef::parse("agent:main:subagent:s", "main").expect("ref");
        let event = || NewEvent::new(at.clone(), EventKind::Compacted, ActorType::System, "x");
        let n = 2 * PRUNE_STEP_ROWS + 10;
        for _ in 0..n {
            store.record(event(), T0).await.expect("record");
        }
        let keep = 10_u64;
        let step = PruneStep::RowCap { max_rows: keep };
        let prune = store.prune_chunk(&step, 10_000, T0);
        let record = async {
            // Waits (a bounded wait: the chunk's first step changes the count) for the chunk
            // to have begun, then records.
            while store.log_stats().await.expect("stats").rows == n as u64 {
                YieldOnce(false).await;
            }
            store.record(event(), T0).await.expect("record");
        };
        let (deleted, ()) = tokio::join!(prune, record);
        assert_eq!(
            deleted.expect("prune"),
            n as u64 + 1 - keep,
            "the recording landed between two steps of the chunk, which capped it too"
        );
        assert_eq!(store.log_stats().await.expect("stats").rows, keep);
    }

    /// Pruning or deleting an event lets go of its dedupe key: the map of keys stays as small as
    /// the retained log, so a long-running embedded store under retention does not grow without
    /// bound. (What the mutation did: the key of a removed event stayed in the map for good;
    /// review of stop 69, M606.)
    #[tokio::test]
    async fn a_removed_events_dedupe_key_is_let_go() {
        let store = MemoryStore::new();
        let at = SessionRef::parse("agent:main:subagent:s", "main").expect("ref");
        let e = NewEvent::new(at.clone(), EventKind::Compacted, ActorType::System, "x")
            .with_dedupe_key("k");
        store.record(e, T0).await.expect("record");
        store
            .prune_chunk(&PruneStep::RowCap { max_rows: 0 }, 10, T0)
            .await
            .expect("prune");
        assert!(
            store.lock().dedupe.is_empty(),
            "the pruned event's dedupe key is let go"
        );
    }

    /// A deleted session leaves nothing behind in the map of refs, and a removed cursor nothing in
    /// the indexes: a gateway whose subagents come and go keeps a store as small as what is live.
    /// (What the mutations did: a deletion left the ref's emptied entry, M643; a removed cursor
    /// left its watcher in the index of its target, M605, or its key in the index of its
    /// watcher, M645; review of stop 69.)
    #[tokio::test]
    async fn a_deleted_session_and_a_removed_cursor_leave_nothing_behind() {
        let store = MemoryStore::new();
        let at = SessionRef::parse("agent:main:subagent:s", "main").expect("ref");
        let manager = WatcherKey::parse("agent:main:main").expect("watcher");
        store.watch(&manager, &at, T0).await.expect("watch");
        let e = NewEvent::new(at.clone(), EventKind::Compacted, ActorType::System, "x");
        store.record(e, T0).await.expect("record");
        assert!(
            store
                .unwatch(&manager, &at.session_key)
                .await
                .expect("unwatch")
        );
        store.delete_session(&at).await.expect("delete");
        let g = store.lock();
        assert!(g.sessions.is_empty(), "the deleted ref's entry is gone");
        assert!(g.by_target.is_empty(), "the index of targets is empty");
        assert!(g.by_watcher.is_empty(), "the index of watchers is empty");
    }

    /// The maps' hasher tells keys apart: session keys that differ in any byte, in a whole 8-byte
    /// chunk or in the tail after the last one, hash differently, so a lookup in the maps of refs,
    /// dedupe keys and cursor indexes probes one slot instead of scanning every entry.
    /// (What the mutation did: every key hashed to the same value, so each lookup scanned its
    /// whole map; review of stop 71, MF33.)
    #[test]
    fn the_maps_hasher_tells_keys_apart() {
        use std::hash::BuildHasher as _;
        let keys = [
            "agent:main:main",
            "agent:main:subagent:a",
            "agent:main:subagent:b",
            "agent:mbin:subagent:a",
            "agent:main:subagent:aa",
            "k1",
            "k2",
        ];
        let hashes: BTreeSet<u64> = keys
            .iter()
            .map(|k| FxBuild::default().hash_one(k))
            .collect();
        assert_eq!(hashes.len(), keys.len(), "distinct keys hash apart");
    }

    /// A caller that waited for the lock stops counting itself once it has it: a pruning chunk
    /// defers to callers blocked on the lock, and a count left up would make every later step of
    /// every pass spin for the whole deferral. (What the mutation did: the count was never taken
    /// down; review of stop 69, M601.)
    #[test]
    fn a_caller_that_waited_for_the_lock_is_no_longer_counted() {
        let store = Arc::new(MemoryStore::new());
        let held = store.lock();
        let other = Arc::clone(&store);
        let waiter = std::thread::spawn(move || drop(other.lock()));
        // A bounded wait: the waiter counts itself as soon as it finds the lock held.
        while store.blocked.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        drop(held);
        waiter.join().expect("waiter");
        assert_eq!(
            store.blocked.load(Ordering::Acquire),
            0,
            "the waiter no longer counts once it had the lock"
        );
    }
}
