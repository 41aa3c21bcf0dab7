//! [`EventStore`] for [`SqliteStore`]: recording, reconcile pages, heads, pruning, deletion.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use awareness_core::reconcile::ChangesPage;
use awareness_core::{
    AgentId, EventStore, Head, LogStats, NewEvent, PruneStep, Recorded, Sequence, SessionRef,
    StoreError, Timestamp, WatcherKey, async_trait, protocol, reconcile, retention,
};
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteRow;

use crate::conn::{Hints, Query, WriteGuard, batch, batch_one, get, persist_cursors};
use crate::decode::{self, int, limit};
use crate::group::{self, Job};
use crate::{PRUNE_TX_ROWS, PRUNE_WEIGHT, SqliteStore, sql};

/// The record batches' binds (see [`sql::RECORD_BEGIN`]).
fn record_query(
    sql: &'static str,
    event: &awareness_core::Event,
    payload: Option<&str>,
    now: Timestamp,
) -> Query {
    sqlx::query(sql)
        .bind(event.dedupe_key.as_deref())
        .bind(event.session_key.as_str())
        .bind(event.session_id.as_deref())
        .bind(event.agent_id.as_str())
        .bind(event.kind.as_str())
        .bind(event.actor_type.as_str())
        .bind(event.actor_id.as_deref())
        .bind(event.run_id.as_deref())
        .bind(event.occurred_at.millis())
        .bind(event.summary.as_str())
        .bind(payload)
        .bind(now.millis())
        .bind(decode::fields_json(event, payload))
}

/// The stored event of a dedupe hit (column 2 of a record batch's row); `path`, the store's
/// file, names it in the warnings.
fn dedupe_hit(
    row: &SqliteRow,
    event: &awareness_core::Event,
    path: &Path,
) -> Result<Recorded, StoreError> {
    const WHAT: &str = "record an event";
    // As bytes: a row holding text that is not UTF-8 fails naming it, not as a column.
    let stored: Option<&[u8]> = get(row, 2, WHAT)?;
    let stored = stored.ok_or_else(|| dedupe_key_without_row(WHAT, event.dedupe_key.as_deref()))?;
    Ok(Recorded {
        event: Arc::new(decode::one_event(stored, path)?),
        deduplicated: true,
        notices: Vec::new(),
    })
}

/// The error of a dedupe hit whose row is gone: the key itself, quoted (not an `Option`).
fn dedupe_key_without_row(what: &str, key: Option<&str>) -> StoreError {
    StoreError::corrupt(format!(
        "{what}: the dedupe key {:?} conflicted but has no row",
        key.unwrap_or_default()
    ))
}

/// Runs a record batch ([`sql::RECORD_BEGIN`], [`sql::RECORD_ONE_BATCH`]) and answers its
/// one row. SQLite fails an insert with FULL ("database or disk is full") both when the disk
/// is full and when the events' AUTOINCREMENT counter is at `i64::MAX`, its end; the counter,
/// read on the same connection after the failure, tells which, and the second becomes the
/// error every store gives once its counter is at its end ([`StoreError::Corrupt`] naming the
/// sequence counter, SQLite's error as its source). A full disk keeps SQLite's error.
///
/// The transaction is rolled back before the counter is read, so that what is read is what
/// was committed: a full disk that failed a later statement of the batch, after the insert
/// took the last number, is not the counter's end (that number was never committed). The
/// caller's own rollback then finds no transaction, which it allows.
async fn record_batch(conn: &mut SqliteConnection, q: Query) -> Result<SqliteRow, StoreError> {
    const WHAT: &str = "record an event";
    let e = match batch_one(conn, q, WHAT).await {
        Err(e) if crate::error::is_full(&e) => e,
        done => return done,
    };
    if let Err(rollback) = sqlx::raw_sql(sql::ROLLBACK).execute(&mut *conn).await {
        // SQLite may have ended the transaction itself on this error.
        tracing::debug!(error = %awareness_core::error::ErrorChain(&rollback), "rolling back a recording the database refused as full");
    }
    // Read whole (not `fetch_optional`), so that no statement is left open on the connection.
    match sqlx::query_scalar::<_, i64>(sql::SEQUENCE_COUNTER)
        .fetch_all(&mut *conn)
        .await
        .as_deref()
    {
        Ok(&[at]) if at == i64::MAX => Err(StoreError::counter_at_end(
            at.unsigned_abs(),
            i64::MAX.unsigned_abs(),
            Some(Box::new(e)),
        )),
        _ => Err(e),
    }
}

/// A page (one JSON text of many rows) holding text that is not UTF-8; the rows are read again
/// one at a time to name the one at fault.
fn page_not_utf8(what: &str, e: std::str::Utf8Error) -> StoreError {
    StoreError::Corrupt {
        context: format!("{what}: a row holds text that is not UTF-8"),
        source: Some(Box::new(e)),
    }
}

/// What the one-batch recording found.
enum Fast {
    /// Recorded and committed.
    Done(Recorded),
    /// The target has cursors: nothing was written; record it (given back, boxed: an event is
    /// several times larger than a `Recorded`) the two-batch way.
    Watched(Box<awareness_core::Event>),
}

/// Records an event whose cursor effects, with no cursor on the target, are none (core says
/// so before this is chosen), in one batch that commits. The insert is guarded by "the target
/// has no cursor" under the write lock, so the precondition holds when it commits; when the
/// guard finds a cursor, nothing is written (not even a sequence is spent). `path`, the store's
/// file, names it in the warnings.
async fn record_fast(
    conn: &mut SqliteConnection,
    path: &Path,
    mut event: awareness_core::Event,
    payload: Option<&str>,
    now: Timestamp,
) -> Result<Fast, StoreError> {
    const WHAT: &str = "record an event";
    let q = record_query(sql::RECORD_ONE_BATCH, &event, payload, now);
    let row = record_batch(conn, q).await?;
    if get::<i64>(&row, 3, WHAT)? != 0 {
        return Ok(Fast::Watched(Box::new(event)));
    }
    if get::<i64>(&row, 0, WHAT)? == 0 {
        return dedupe_hit(&row, &event, path).map(Fast::Done);
    }
    event.sequence = decode::sequence(WHAT, get(&row, 1, WHAT)?)?;
    let effects = protocol::on_event(&event, &[], &[], now);
    debug_assert!(
        effects.upserts.is_empty(),
        "checked before choosing this path"
    );
    Ok(Fast::Done(Recorded {
        event: Arc::new(event),
        deduplicated: false,
        notices: effects.notices,
    }))
}

/// Records an event in two batches: insert, head and the cursors on the target; then what
/// `protocol::on_event` decides, and commit. Also says whether the target has cursors now
/// (`None` after a dedupe hit, which reads none). `path`, the store's file, names it in the
/// warnings.
async fn record_two_batches(
    conn: &mut SqliteConnection,
    path: &Path,
    mut event: awareness_core::Event,
    payload: Option<&str>,
    named: &[WatcherKey],
    now: Timestamp,
) -> Result<(Recorded, Option<bool>), StoreError> {
    const WHAT: &str = "record an event";
    let q = record_query(sql::RECORD_BEGIN, &event, payload, now);
    let row = record_batch(conn, q).await?;
    if get::<i64>(&row, 0, WHAT)? == 0 {
        // Dedupe hit: nothing moves, but the spent sequence is committed (as OpenClaw's), and
        // committed before the stored row is read: a row that cannot be read fails the call
        // having spent its sequence, as in one batch (`record_fast`) and in a group commit.
        batch(conn, sqlx::query(sql::COMMIT), WHAT).await?;
        return Ok((dedupe_hit(&row, &event, path)?, None));
    }
    event.sequence = decode::sequence(WHAT, get(&row, 1, WHAT)?)?;
    let existing: Option<&[u8]> = get(&row, 3, WHAT)?;
    let rows = decode::CursorRows::read(existing.unwrap_or(b"[]"))?;
    // A row that cannot be read stays watched (its row is there), for the hint.
    let damaged = !rows.unreadable.is_empty();
    let existing = rows.warned(path);
    let effects = protocol::on_event(&event, named, &existing, now);
    persist_cursors(conn, &effects.upserts, WHAT).await?;
    let watched = damaged || !existing.is_empty() || !effects.upserts.is_empty();
    Ok((
        Recorded {
            event: Arc::new(event),
            deduplicated: false,
            notices: effects.notices,
        },
        Some(watched),
    ))
}

/// The answer a queued recording got from the writer that recorded it.
fn answered(
    got: Result<Result<Recorded, StoreError>, tokio::sync::oneshot::error::RecvError>,
) -> Result<Recorded, StoreError> {
    got.unwrap_or_else(|_| {
        Err(StoreError::backend(
            "record an event",
            "the group commit holding this event stopped before answering (it panicked, or it could not be finished once the runtime of the caller that started it shut down); whether the event was committed is not known: read it back, or record it again (under the same dedupe key, if it had one, so as not to record it twice)",
        ))
    })
}

/// Records one event inside the begun write operation on `w`'s connection: one batch when core
/// says the event moves no cursor on an unwatched target and the target is not known to be
/// watched; two batches otherwise.
pub(crate) async fn record_alone(
    w: &mut crate::conn::Writer,
    hints: &Hints,
    event: awareness_core::Event,
    payload: Option<String>,
    named: &[WatcherKey],
    now: Timestamp,
) -> Result<Recorded, StoreError> {
    let crate::conn::Writer { conn, path, .. } = w;
    let one_batch = protocol::on_event(&event, named, &[], now)
        .upserts
        .is_empty()
        && !hints.is_watched(&event.session_key);
    let key = event.session_key.clone();
    let event = if one_batch {
        match record_fast(conn, path, event, payload.as_deref(), now).await? {
            Fast::Done(rec) => return Ok(rec),
            Fast::Watched(event) => *event,
        }
    } else {
        event
    };
    let (rec, watched) =
        record_two_batches(conn, path, event, payload.as_deref(), named, now).await?;
    if let Some(watched) = watched {
        hints.set_watched(&key, watched);
    }
    Ok(rec)
}

// Every error the methods return names the file: each one's work is done by the inherent
// method of the same name with `_inner` (below), whose result goes through `named`.
#[async_trait]
impl EventStore for SqliteStore {
    async fn close(self: Arc<Self>) {
        // Of handles closed at once, exactly one gets the store (`try_unwrap` could fail for
        // each, leaving the close to a drop on the runtime).
        if let Some(store) = Arc::into_inner(self) {
            SqliteStore::close(store).await;
        }
    }

    async fn record(&self, event: NewEvent, now: Timestamp) -> Result<Recorded, StoreError> {
        self.named(self.record_inner(event, now).await)
    }

    async fn changes_since(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError> {
        self.named(self.changes_since_inner(session, after, limit).await)
    }

    async fn heads(&self, sessions: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        self.named(self.heads_inner(sessions).await)
    }

    async fn list_heads(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        self.named(self.list_heads_inner(agent).await)
    }

    async fn events_after(
        &self,
        after: Sequence,
        max: usize,
    ) -> Result<Vec<Arc<awareness_core::Event>>, StoreError> {
        self.named(self.events_after_inner(after, max).await)
    }

    async fn foreign_commits(&self) -> Result<Option<u64>, StoreError> {
        self.named(self.data_version().await.map(Some))
    }

    /// Polls `PRAGMA data_version` every [`SqliteOptions::commit_hint_interval`](crate::SqliteOptions::commit_hint_interval)
    /// on a connection of its own, from the first call on (one poller per handle, shared by its
    /// streams), and hints once it has begun (for what came before) and at each commit
    /// another writer made after that: this handle's own are left out (at a change, the write connection is asked for the
    /// number [`foreign_commits`](awareness_core::EventStore::foreign_commits) answers with).
    /// The streams end once the handle is dropped or closed.
    fn commit_hints(&self) -> Option<Box<dyn awareness_core::CommitHints>> {
        Some(self.subscribe_commit_hints())
    }

    async fn log_stats(&self) -> Result<LogStats, StoreError> {
        self.named(self.log_stats_inner().await)
    }

    /// Deletes up to `max_rows` rows in write transactions of at most 250 rows
    /// each, releasing the write connection between them: a recording waits behind one such
    /// transaction (a few milliseconds), not behind the whole chunk. Each transaction stamps
    /// the watermarks of what it deletes before deleting it, so every commit point keeps the
    /// invariants; the result is the same as one transaction of `max_rows` (the workspace test
    /// `tests/tests/pruning_chunks.rs` checks this: a chunk larger than one transaction ends
    /// exactly as the reference store's chunk does).
    async fn prune_chunk(
        &self,
        step: &PruneStep,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        self.named(self.prune_chunk_inner(step, max_rows, now).await)
    }

    async fn delete_session(&self, session: &SessionRef) -> Result<(), StoreError> {
        self.named(self.delete_session_inner(session).await)
    }
}

// The work of the `EventStore` methods, whose errors do not name the file yet.
impl SqliteStore {
    async fn record_inner(
        &self,
        mut event: NewEvent,
        now: Timestamp,
    ) -> Result<Recorded, StoreError> {
        const WHAT: &str = "record an event";
        event.validate()?;
        let named = std::mem::take(&mut event.watchers);
        // Core builds the stored event (it clamps occurredAt); the sequence comes from SQLite.
        let event = event.into_event(Sequence::ZERO, now);
        let payload = event.payload.as_ref().map(decode::to_json);
        let writer = self.write_connection(WHAT)?;
        if self.group_commit <= 1 {
            // Every transaction holds one recording: a read once the first has been counted.
            if self.largest_batch.load(Ordering::Relaxed) == 0 {
                self.largest_batch.store(1, Ordering::Relaxed);
            }
            let mut w = self.writer(WHAT).await?;
            let res = record_alone(&mut w, &self.hints, event, payload, &named, now).await;
            return w.finish(res).await;
        }
        // Group commit: queue the event, then either another writer records it with its batch
        // (the reply comes first), or this caller gets the write connection and records what
        // the queue holds. A batch runs on a task of its own, spawned on the caller's Tokio
        // runtime: outside one, a clear error now, before anything is queued, instead of a
        // panic at the spawn, which would drop the events of the batch it took.
        let rt = tokio::runtime::Handle::try_current().map_err(|e| {
            StoreError::backend(
                format!(
                    "{WHAT}: called outside a Tokio runtime (store-sqlite commits a batch of recordings on a Tokio task)"
                ),
                e,
            )
        })?;
        let id = self.next_job.fetch_add(1, Ordering::Relaxed);
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        self.queue.push(Job {
            id,
            event,
            payload,
            named,
            now,
            reply,
        });
        // Should this call be cancelled while its event still waits in the queue, the event
        // leaves the queue with it instead of being committed later by someone else's batch.
        let mut queued = awareness_core::queue::Queued::new(&self.queue, id);
        loop {
            let mut w = tokio::select! {
                biased;
                got = &mut answer => {
                    queued.taken();
                    return answered(got);
                }
                w = WriteGuard::lock(writer) => w,
            };
            // What an interrupted operation left open is rolled back before other callers'
            // events are taken from the queue: from the take until the batch's task is spawned
            // there is no await, so cancelling this call cannot drop their events.
            if w.open_tx {
                w.rollback().await;
            }
            let mut jobs = self.queue.take(self.group_commit);
            self.largest_batch.fetch_max(jobs.len(), Ordering::Relaxed);
            let mine = jobs.iter().any(|j| j.id == id);
            if mine || jobs.is_empty() {
                // Either this caller holds its own event, or an earlier writer took it and
                // answers before it lets go of the connection.
                queued.taken();
            }
            if jobs.is_empty() {
                drop(w);
                return answered(answer.await);
            }
            // No await from the take until the batch's task is spawned (see above).
            w.begin();
            self.count_write(1);
            if jobs.len() == 1 && mine {
                // Alone: record as without group commit (a cancellation cancels only this call).
                let Some(Job {
                    event,
                    payload,
                    named,
                    now,
                    ..
                }) = jobs.pop()
                else {
                    unreachable!("one job was taken")
                };
                let res = record_alone(&mut w, &self.hints, event, payload, &named, now).await;
                return w.finish(res).await;
            }
            // A batch holding other callers' events runs on a task of its own, so that
            // cancelling this call cancels nobody's commit; dropped with its runtime, the task
            // hands the batch to a thread that finishes it ([`group::Unfinished`]).
            let hints = Arc::clone(&self.hints);
            let path = Arc::clone(&w.path);
            let mut batch = group::Unfinished::new(
                async move { group::record_batch(&mut w, jobs, &hints).await },
                path,
            );
            rt.spawn(async move { batch.run().await });
            if mine {
                return answered(answer.await);
            }
            // The queue held `group_commit` older events than this one: wait for the
            // connection again (or for a writer that takes this event with its batch).
        }
    }

    async fn changes_since_inner(
        &self,
        session: &SessionRef,
        after: Sequence,
        limit: usize,
    ) -> Result<ChangesPage, StoreError> {
        const WHAT: &str = "read changes since";
        let limit = reconcile::clamp_limit(Some(limit));
        let q = sqlx::query(sql::CHANGES_SINCE)
            .bind(session.session_key.as_str().to_owned())
            .bind(session.agent_id.as_str().to_owned())
            .bind(int(after))
            .bind(decode::limit(limit + 1));
        let row = self.read_one(q, WHAT).await?;
        let head: Option<&str> = get(&row, 0, WHAT)?;
        let head = head.map(|h| decode::head_of(session, h)).transpose()?;
        let min: Option<i64> = get(&row, 1, WHAT)?;
        let min = min.map(|m| decode::sequence(WHAT, m)).transpose()?;
        let sequences: &str = get(&row, 2, WHAT)?;
        // As bytes: SQLite copies a row's text that is not UTF-8 into the page as it is.
        let fields: &[u8] = get(&row, 3, WHAT)?;
        let fetched = match std::str::from_utf8(fields)
            .map_err(|e| page_not_utf8(WHAT, e))
            .and_then(|fields| decode::page_events(sequences, fields, session, &self.path))
        {
            Ok(fetched) => fetched,
            Err(page) => {
                return Err(self
                    .page_event_at_fault(session, after, limit + 1, page)
                    .await);
            }
        };
        Ok(reconcile::build_page(
            after,
            head.as_ref(),
            min,
            fetched,
            limit,
        ))
    }

    async fn heads_inner(&self, sessions: &[SessionRef]) -> Result<Vec<Head>, StoreError> {
        const WHAT: &str = "read heads";
        if sessions.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<(&str, &str)> = sessions
            .iter()
            .map(|r| (r.session_key.as_str(), r.agent_id.as_str()))
            .collect();
        let q = sqlx::query(sql::HEADS).bind(decode::to_json(&refs));
        let row = self.read_one(q, WHAT).await?;
        decode::heads(get(&row, 0, WHAT)?)
    }

    async fn list_heads_inner(&self, agent: Option<&AgentId>) -> Result<Vec<Head>, StoreError> {
        const WHAT: &str = "list heads";
        let agent = agent.map(|a| a.as_str().to_owned());
        let q = sqlx::query(sql::LIST_HEADS).bind(agent.clone());
        let row = self.read_one(q, WHAT).await?;
        let all: &[u8] = get(&row, 0, WHAT)?;
        if std::str::from_utf8(all).is_ok() {
            return decode::listed_heads(all, &self.path);
        }
        // A row holds text that is not UTF-8: the rows one by one, so that exactly that row is
        // left out (a key holding U+FFFD is a valid key).
        let mut conn = self.reader().await;
        let rows = batch(
            &mut conn,
            sqlx::query(sql::LIST_HEADS_EACH).bind(agent),
            WHAT,
        )
        .await?;
        let read = rows
            .iter()
            .map(|row| {
                decode::head_row(
                    get(row, 0, WHAT)?,
                    get(row, 1, WHAT)?,
                    get(row, 2, WHAT)?,
                    get(row, 3, WHAT)?,
                    get(row, 4, WHAT)?,
                )
            })
            .collect();
        Ok(decode::warned_heads(read, &self.path))
    }

    async fn events_after_inner(
        &self,
        after: Sequence,
        max: usize,
    ) -> Result<Vec<Arc<awareness_core::Event>>, StoreError> {
        const WHAT: &str = "read events after";
        let q = sqlx::query(sql::EVENTS_AFTER)
            .bind(int(after))
            .bind(limit(max));
        let row = self.read_one(q, WHAT).await?;
        // As bytes: SQLite copies a row's text that is not UTF-8 into the page as it is.
        let page: &[u8] = get(&row, 0, WHAT)?;
        match std::str::from_utf8(page)
            .map_err(|e| page_not_utf8(WHAT, e))
            .and_then(|page| decode::events(page, &self.path))
        {
            Ok(events) => Ok(events),
            Err(page) => self.events_after_each(after, max, page).await,
        }
    }

    /// [`Self::events_after_inner`] read again one row at a time, when the page could not be
    /// read as a whole (`page`, its error): fails with the error of the first row that cannot
    /// be read on its own, which names it (`event <sequence>`, its key and agent), so that an
    /// operator can act on it (decision 0016: a read that meets such a row fails). Should
    /// every row read (the row at fault changed or went between the two reads), the rows read
    /// are the answer.
    async fn events_after_each(
        &self,
        after: Sequence,
        max: usize,
        page: StoreError,
    ) -> Result<Vec<Arc<awareness_core::Event>>, StoreError> {
        const WHAT: &str = "read events after";
        let q = sqlx::query(sql::EVENTS_AFTER_EACH)
            .bind(int(after))
            .bind(limit(max));
        let mut conn = self.reader().await;
        let rows = match batch(&mut conn, q, WHAT).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %awareness_core::error::ErrorChain(&e), "reading events one row at a time to name the one that cannot be read failed");
                return Err(page);
            }
        };
        let events: Result<Vec<_>, StoreError> = rows
            .iter()
            .map(|row| {
                decode::logged_event(
                    get(row, 0, WHAT)?,
                    get(row, 1, WHAT)?,
                    get(row, 2, WHAT)?,
                    get(row, 3, WHAT)?,
                    &self.path,
                )
                .map(Arc::new)
            })
            .collect();
        if events.is_ok() {
            // The row at fault changed or went between the two reads: said, since a decoder of
            // a page stricter than the one of a row would otherwise go unseen here.
            tracing::warn!(path = %self.path.display(), error = %awareness_core::error::ErrorChain(&page), "a log page that could not be read read row by row; those rows are the answer");
        }
        events
    }

    /// The error of a ref's page that could not be read as a whole (`page`): the error of the
    /// first of its events, after `after` and at most `max`, that cannot be read on its own,
    /// read again one row at a time, which names it (`event <sequence> of <session>`); `page`
    /// itself should every row read (the row at fault changed or went between the two reads:
    /// the page, read with its head, is not pieced together from a later read).
    async fn page_event_at_fault(
        &self,
        session: &SessionRef,
        after: Sequence,
        max: usize,
        page: StoreError,
    ) -> StoreError {
        const WHAT: &str = "read changes since";
        let q = sqlx::query(sql::CHANGES_SINCE_EACH)
            .bind(session.session_key.as_str().to_owned())
            .bind(session.agent_id.as_str().to_owned())
            .bind(int(after))
            .bind(limit(max));
        let mut conn = self.reader().await;
        let rows = match batch(&mut conn, q, WHAT).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), session_key = %session.session_key, agent_id = %session.agent_id, error = %awareness_core::error::ErrorChain(&e), "reading a page one row at a time to name the event that cannot be read failed");
                return page;
            }
        };
        rows.iter()
            .find_map(|row| {
                let seq = get(row, 0, WHAT);
                let fields = get(row, 1, WHAT);
                match (seq, fields) {
                    (Ok(seq), Ok(fields)) => {
                        decode::page_event(seq, fields, session, &self.path).err()
                    }
                    (Err(e), _) | (_, Err(e)) => Some(e),
                }
            })
            .unwrap_or(page)
    }

    async fn log_stats_inner(&self) -> Result<LogStats, StoreError> {
        const WHAT: &str = "read log stats";
        let row = self.read_one(sqlx::query(sql::LOG_STATS), WHAT).await?;
        Ok(LogStats {
            rows: decode::sequence(WHAT, get(&row, 0, WHAT)?)?.get(),
            min_sequence: decode::sequence(WHAT, get(&row, 1, WHAT)?)?,
            max_sequence: decode::sequence(WHAT, get(&row, 2, WHAT)?)?,
        })
    }

    async fn prune_chunk_inner(
        &self,
        step: &PruneStep,
        max_rows: usize,
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        // Refused on a read-only handle even when asked for no rows, like every write.
        self.write_connection("prune")?;
        let step = match *step {
            PruneStep::Cursors { cutoff } => {
                return self.prune_idle_cursors(cutoff, max_rows).await;
            }
            PruneStep::Age { cutoff } => EventStep::Age(cutoff),
            PruneStep::RowCap { max_rows: keep } => EventStep::RowCap(keep),
        };
        let step = &step;
        retention::in_transactions(max_rows, PRUNE_TX_ROWS, |bound| async move {
            let mut w = self.writer("prune").await?;
            self.count_write(PRUNE_WEIGHT - 1);
            let res = prune_tx(&mut w.conn, &self.path, step, bound, now).await;
            // Victims are chosen inside the transaction: every one chosen is deleted.
            let deleted = w.finish(res).await?;
            Ok((usize::try_from(deleted).unwrap_or(usize::MAX), deleted))
        })
        .await
    }

    async fn delete_session_inner(&self, session: &SessionRef) -> Result<(), StoreError> {
        const WHAT: &str = "delete a session";
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let key = session.session_key.as_str().to_owned();
            let q = sqlx::query(sql::DELETE_SESSION_BEGIN).bind(key.clone());
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            let on_target = decode::CursorRows::read(get(&row, 0, WHAT)?)?;
            // Every row on the key goes but the readable cursors on another agent's session of
            // it. A row that cannot be read goes too: its agent is unknown, and it could only be
            // left behind for good (decision 0016). Naming the rows kept rather than those that
            // go reaches a row whose watcher key is not UTF-8, which no text read back names.
            let kept: Vec<(&str, &str)> = on_target
                .readable
                .iter()
                .filter(|c| !c.removed_by_delete(session))
                .map(|c| (c.watcher.as_str(), c.target.as_str()))
                .collect();
            let q = sqlx::query(sql::DELETE_SESSION_COMMIT)
                .bind(key)
                .bind(session.agent_id.as_str().to_owned())
                .bind(decode::to_json(&kept))
                .bind(i64::from(session.is_watcher()));
            batch(&mut w.conn, q, WHAT).await.map(drop)
        }
        .await;
        w.finish(res).await
    }

    /// A chunk of the idle-cursor step. The cursors' table has no index on `updated_at` (its
    /// schema is OpenClaw's), so choosing idle cursors reads every row up to the bound: it is
    /// done on a reader, where recordings do not wait for it, each transaction going on in key
    /// order from where the one before stopped; the write deletes those chosen that are still
    /// idle. A cursor created behind that point during the chunk waits for the next pass.
    async fn prune_idle_cursors(
        &self,
        cutoff: Timestamp,
        max_rows: usize,
    ) -> Result<u64, StoreError> {
        const WHAT: &str = "prune idle cursors";
        let after: std::sync::Mutex<Option<(String, String)>> = std::sync::Mutex::default();
        let after = &after;
        retention::in_transactions(max_rows, PRUNE_TX_ROWS, |bound| async move {
            let resume = after
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let q = match resume {
                None => sqlx::query(sql::PRUNE_CURSORS_CHOOSE)
                    .bind(cutoff.millis())
                    .bind(limit(bound)),
                Some((watcher, target)) => sqlx::query(sql::PRUNE_CURSORS_CHOOSE_AFTER)
                    .bind(cutoff.millis())
                    .bind(limit(bound))
                    .bind(watcher)
                    .bind(target),
            };
            let row = self.read_one(q, WHAT).await?;
            let chosen = decode::chosen_cursors(get(&row, 0, WHAT)?)?;
            let Some((watcher, target)) = chosen.last() else {
                return Ok((0, 0));
            };
            #[cfg(test)]
            crate::tests::BETWEEN_CHOICE_AND_DELETE.at(&self.path).await;
            *after
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some((watcher.clone(), target.clone()));
            let mut w = self.writer(WHAT).await?;
            self.count_write(PRUNE_WEIGHT - 1);
            let q = sqlx::query(sql::PRUNE_CURSORS_DELETE)
                .bind(decode::to_json(&chosen))
                .bind(cutoff.millis());
            let res = async {
                let row = batch_one(&mut w.conn, q, WHAT).await?;
                Ok(decode::sequence(WHAT, get(&row, 0, WHAT)?)?.get())
            }
            .await;
            let deleted = w.finish(res).await?;
            Ok((chosen.len(), deleted))
        })
        .await
    }
}

/// A pruning step that deletes events.
enum EventStep {
    /// [`PruneStep::Age`], by its cutoff.
    Age(Timestamp),
    /// [`PruneStep::RowCap`], by the rows to keep.
    RowCap(u64),
}

/// One pruning transaction of an event step, which chooses its victims inside it. `path`, the
/// store's file, names it in the warnings.
async fn prune_tx(
    conn: &mut SqliteConnection,
    path: &Path,
    step: &EventStep,
    max_rows: usize,
    now: Timestamp,
) -> Result<u64, StoreError> {
    const WHAT: &str = "prune";
    let victims_row = match *step {
        EventStep::Age(cutoff) => {
            let q = sqlx::query(sql::PRUNE_AGE_BEGIN)
                .bind(cutoff.millis())
                .bind(limit(max_rows));
            batch_one(conn, q, WHAT).await?
        }
        EventStep::RowCap(keep) => {
            let row = batch_one(conn, sqlx::query(sql::PRUNE_CAP_BEGIN), WHAT).await?;
            let retained = decode::sequence(WHAT, get(&row, 0, WHAT)?)?.get();
            let n = retention::row_cap_victims(retained, keep, max_rows);
            if n == 0 {
                batch(conn, sqlx::query(sql::COMMIT), WHAT).await?;
                return Ok(0);
            }
            batch_one(
                conn,
                sqlx::query(sql::PRUNE_CAP_VICTIMS).bind(limit(n)),
                WHAT,
            )
            .await?
        }
    };
    let victims = decode::victims(get(&victims_row, 0, WHAT)?, path)?;
    if victims.is_empty() {
        batch(conn, sqlx::query(sql::COMMIT), WHAT).await?;
        return Ok(0);
    }
    let heads: BTreeMap<SessionRef, Head> =
        decode::victim_heads(get(&victims_row, 1, WHAT)?, path)?
            .into_iter()
            .map(|h| (h.session.clone(), h))
            .collect();
    // Watermarks are stamped before the rows go, in the same transaction; a ref without a head
    // gets none (pruning never creates a head).
    let stamps: Vec<(&str, &str, i64, i64)> =
        retention::watermarks(victims.iter().filter_map(|(_, stamp)| {
            let (r, s) = stamp.as_ref()?;
            Some((r, *s))
        }))
        .into_iter()
        .filter_map(|(r, pruned)| {
            let head = heads.get(&r)?;
            let stamped = retention::stamp(head, pruned, now);
            Some((
                head.session.session_key.as_str(),
                head.session.agent_id.as_str(),
                int(stamped.pruned_max_sequence),
                stamped.updated_at.millis(),
            ))
        })
        .collect();
    let seqs: Vec<i64> = victims.iter().map(|(s, _)| *s).collect();
    let q = sqlx::query(sql::PRUNE_DELETE_COMMIT)
        .bind(decode::to_json(&stamps))
        .bind(decode::to_json(&seqs));
    let row = batch_one(conn, q, WHAT).await?;
    Ok(decode::sequence(WHAT, get(&row, 0, WHAT)?)?.get())
}

#[cfg(test)]
mod message_tests {
    use super::*;

    /// The key is shown as it is, not as Rust's `Some("k")`.
    #[test]
    fn a_dedupe_key_without_its_row_is_named_as_it_is() {
        let e = dedupe_key_without_row("record an event", Some("k"));
        assert_eq!(
            e.to_string(),
            "corrupt store: record an event: the dedupe key \"k\" conflicted but has no row"
        );
    }
}
