//! The key layout, and the row operations every transaction shares.
//!
//! | table | key | value |
//! |---|---|---|
//! | `meta` | name | `u64` (`schema_version`, `last_sequence`, `reserved_sequence`) |
//! | `events` | sequence | the event row ([`crate::codec`]) |
//! | `events_by_ref` | (agent id, session key, sequence) | a copy of the event row |
//! | `events_by_ref` | (agent id, session key, [`HEAD_SEQ`]) | the head: (last sequence, pruned watermark, updated at) |
//! | `dedupe` | dedupe key | sequence |
//! | `cursors` | (watcher, target key) | (target agent, last seen, notified, material, updated at) |
//! | `cursors_by_target` | (target key, watcher) | `()` |
//! | `upstream_links` | (session key, agent id) | the link as compact JSON (section 8) |
//!
//! `events_by_ref` is a covering index: it holds a copy of the row, so a reconcile page is one
//! range scan instead of one lookup per event (the copy costs no extra insert; side by side it
//! took a quarter to a third off `reconcile/200`, whose rest is mostly allocating the events).
//!
//! A ref's head is the last entry of the ref's range in `events_by_ref`, under the sequence
//! [`HEAD_SEQ`] (`u64::MAX`, which no event can have: the counter stops below it). It sits next
//! to the ref's newest events, usually on the same page, so a record rewrites two B-tree paths
//! (`events` and `events_by_ref`) instead of three: with a separate `heads` table (schema 1) a
//! record cost 2.0x the one-key floor with `Immediate` durability, 1.64x with the head beside
//! the events (an A/B of bare redb transactions on the 50,000-event data set). Schema 1 files
//! are migrated when opened ([`migrate_v1`]).
//!
//! Schema 3 (the current one, [`SCHEMA_VERSION`]) has schema 2's tables; its number says that
//! `meta` may hold the bounded mode's reservation (below), so that builds of schema 2, which
//! would read past it, refuse the file. A read-write open writes 3 over a file of schema 2 (or
//! 1, after moving its heads); a read-only open reads a file of schema 2 or 3 as it is.
//!
//! The store-wide sequence counter is `max(meta.last_sequence, last key of events)`: recording a
//! new event moves it by inserting the event alone, and whatever would lower it (deleting the
//! event with the highest sequence, a dedupe hit that consumes a number without a row) first
//! raises `meta.last_sequence`. So the counter never goes back and a record writes three rows
//! (event, reference index, head) in two tables.
//!
//! With [`crate::Durability::Bounded`], a crash loses the commits of the last interval, and
//! with them the counter's moves: the numbers they handed out would be handed out again, to
//! other events, after callers had seen them. So a bounded handle reserves numbers ahead:
//! `meta.reserved_sequence` is a number no allocation has passed, raised [`RESERVE_AHEAD`]
//! past the counter by a commit made durable (one per [`RESERVE_AHEAD`] numbers) whenever
//! an allocation would pass it. A read-write open that finds a reservation (the last writer
//! did not close cleanly) moves the counter up to it, so no number handed out before a crash
//! is handed out again; a clean close removes it, so a reopen after one continues exactly.
//!
//! Pruning by age scans `events` in sequence order on a read snapshot and reads `occurredAt` at a
//! fixed offset of the row, without decoding it: old rows are the low sequences, so a chunk stops
//! after about its own size; an index on time would cost every record one more insert.
//!
//! A row that cannot be decoded (a torn write, a hand edit) stops neither pruning nor the
//! deletion of its session: the row cap deletes it in its sequence turn, under the watermark of
//! the session that its entry in `events_by_ref` names (the entry's key needs no decoding),
//! and its dedupe key, unknown, is freed by finding the entries that point at its sequence;
//! deleting its session (or the row) removes it the same way. Both lookups are scans of a whole
//! table, made only once a decode has failed: a sound row costs what it did. A row that decodes
//! but names a session whose index does not hold it (key bytes edited into another valid key)
//! is found when its entry is removed, at no cost to sound rows, and is then handled the same
//! way. The age step, which cannot read such a row's age, keeps it (with a warning) and goes on
//! with the others.

use std::collections::HashSet;
use std::path::Path;

use awareness_core::{
    AgentId, Cursor, Event, Head, Sequence, SessionKey, SessionRef, StoreError, Timestamp,
    WatcherKey,
};
use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use crate::codec;
use crate::db::Ctx;
use crate::raw;

pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(crate) const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
pub(crate) const EVENTS_BY_REF: TableDefinition<(&str, &str, u64), &[u8]> =
    TableDefinition::new("events_by_ref");
pub(crate) const DEDUPE: TableDefinition<&str, u64> = TableDefinition::new("dedupe");
/// The dedupe index with its keys read as their bytes ([`raw`]), as [`EventTables`] opens it: its
/// scan for the keys of event rows that cannot be read reads every key, and a key that is not
/// UTF-8 must not panic in redb's decode there.
pub(crate) const DEDUPE_KEYS: TableDefinition<raw::Bytes<&str>, u64> =
    TableDefinition::new("dedupe");
/// The heads table of schema 1, read by [`migrate_v1`] (and written by [`downgrade_to_v1`],
/// for tests).
const HEADS_V1: TableDefinition<(&str, &str), (u64, u64, i64)> = TableDefinition::new("heads");
/// [`HEADS_V1`] with its keys read as their bytes ([`raw`]), as [`migrate_v1`] reads it.
pub(crate) const HEADS_V1_KEYS: TableDefinition<PairBytes, (u64, u64, i64)> =
    TableDefinition::new("heads");
/// The sequence under which `events_by_ref` keeps a ref's head.
pub(crate) const HEAD_SEQ: u64 = u64::MAX;
/// The highest sequence an event can get (one below [`HEAD_SEQ`]).
pub(crate) const MAX_EVENT_SEQ: u64 = HEAD_SEQ - 1;
/// The reference index (events by (agent, key, sequence), and each ref's head), its keys read
/// and written as their bytes ([`EVENTS_BY_REF_KEYS`]).
pub(crate) type ByRef<'t> = Table<'t, raw::Bytes<RefKey>, &'static [u8]>;
/// A cursor row: (target agent, last seen, notified, material, updated at).
pub(crate) type CursorRow = (&'static str, u64, u64, u64, i64);
/// A key of two strings: (session key, agent id), (watcher, target) or (target, watcher).
pub(crate) type StrPair = (&'static str, &'static str);

/// A key of the reference index: (agent id, session key, sequence).
pub(crate) type RefKey = (&'static str, &'static str, u64);
/// A `(&str, &str)` key read and written as its bytes ([`raw`]).
pub(crate) type PairBytes = raw::Bytes<StrPair>;
/// A cursor row read and written as its bytes ([`raw`]).
pub(crate) type CursorRowBytes = raw::Bytes<CursorRow>;

/// The cursors, `(watcher, target) -> CursorRow` on disk, read from their bytes ([`raw`]): one
/// row damaged at byte level is then unreadable like any other, rather than a panic in redb's
/// decode (docs/decisions/0016).
pub(crate) const CURSORS: TableDefinition<PairBytes, CursorRowBytes> =
    TableDefinition::new("cursors");
/// The by-target index, `(target, watcher) -> ()` on disk, read from its bytes as [`CURSORS`].
pub(crate) const CURSORS_BY_TARGET: TableDefinition<PairBytes, ()> =
    TableDefinition::new("cursors_by_target");
/// The reference index with its keys read as their bytes ([`raw`]): for the listing of heads,
/// which reads every ref's key (docs/decisions/0020), for [`EventTables`], whose deletion of an
/// event row that cannot be read scans every key of the index, and for the test helpers that
/// write such keys. A write transaction opens it only where nothing else has the index open
/// (as [`EVENTS_BY_REF`]).
pub(crate) const EVENTS_BY_REF_KEYS: TableDefinition<raw::Bytes<RefKey>, &[u8]> =
    TableDefinition::new("events_by_ref");
pub(crate) const UPSTREAM_LINKS: TableDefinition<(&str, &str), &[u8]> =
    TableDefinition::new("upstream_links");
/// The upstream links with their keys read as their bytes ([`raw`]), for the listing of links,
/// which reads every key (docs/decisions/0017), and for the test helper that writes such keys.
pub(crate) const UPSTREAM_LINKS_KEYS: TableDefinition<PairBytes, &[u8]> =
    TableDefinition::new("upstream_links");

pub(crate) const SCHEMA_VERSION_KEY: &str = "schema_version";
/// The schema this build writes. 3 has the tables of 2; it marks a file whose `meta` may hold
/// a sequence reservation ([`RESERVED_SEQUENCE`]), which a build of schema 2 would read past
/// and so hand out numbers a crash lost again. Every build refuses a version above its own,
/// so those builds refuse every file this build has opened read-write (docs/decisions/0006).
pub(crate) const SCHEMA_VERSION: u64 = 3;
pub(crate) const LAST_SEQUENCE: &str = "last_sequence";
/// The `meta` key of the bounded mode's reservation (see the module docs).
pub(crate) const RESERVED_SEQUENCE: &str = "reserved_sequence";
/// How far past the counter a bounded handle reserves numbers. A durable commit after a run
/// of non-durable ones costs what they left to write: reserving 4,096 at a time made
/// `record/0_watchers` 15% slower and group commit of 16 tasks 45% slower on `redb-bounded`
/// (A/B, 12-01 23:20), against no measurable cost at 2^20 (one such commit every several
/// seconds at full speed). A crash then skips at most 2^20 numbers, of 2^64.
pub(crate) const RESERVE_AHEAD: u64 = 1 << 20;

/// Creates every table (opening a table in a write transaction creates it).
pub(crate) fn create_all(txn: &WriteTransaction) -> Result<(), StoreError> {
    txn.open_table(EVENTS).ctx("create tables")?;
    txn.open_table(EVENTS_BY_REF).ctx("create tables")?;
    txn.open_table(DEDUPE).ctx("create tables")?;
    txn.open_table(CURSORS).ctx("create tables")?;
    txn.open_table(CURSORS_BY_TARGET).ctx("create tables")?;
    txn.open_table(UPSTREAM_LINKS).ctx("create tables")?;
    Ok(())
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(format!("{what}: {e}"))
}

pub(crate) fn session_ref(key: &str, agent: &str) -> Result<SessionRef, StoreError> {
    SessionRef::parse(key, agent).map_err(|e| corrupt("stored session ref", e))
}

/// A head row: last sequence, pruned watermark (u64 LE) and updated at (i64 LE).
const HEAD_ROW: usize = 24;

fn encode_head(last: u64, pruned: u64, updated_at: i64) -> [u8; HEAD_ROW] {
    let mut out = [0; HEAD_ROW];
    out[..8].copy_from_slice(&last.to_le_bytes());
    out[8..16].copy_from_slice(&pruned.to_le_bytes());
    out[16..].copy_from_slice(&updated_at.to_le_bytes());
    out
}

fn decode_head(session: SessionRef, row: &[u8]) -> Result<Head, StoreError> {
    let Ok(row) = <[u8; HEAD_ROW]>::try_from(row) else {
        return Err(corrupt(
            "stored head",
            format_args!("{session}: {} bytes, not {HEAD_ROW}", row.len()),
        ));
    };
    let word = |i: usize| row[i..i + 8].try_into().expect("eight bytes");
    Ok(Head {
        session,
        last_sequence: Sequence(u64::from_le_bytes(word(0))),
        pruned_max_sequence: Sequence(u64::from_le_bytes(word(8))),
        updated_at: Timestamp(i64::from_le_bytes(word(16))),
    })
}

/// The head of `session`, from the reference index (of a read or a write transaction).
pub(crate) fn read_head(
    by_ref: &impl ReadableTable<(&'static str, &'static str, u64), &'static [u8]>,
    session: &SessionRef,
) -> Result<Option<Head>, StoreError> {
    let key = (
        session.agent_id.as_str(),
        session.session_key.as_str(),
        HEAD_SEQ,
    );
    by_ref
        .get(key)
        .ctx("read a head")?
        .map(|row| decode_head(session.clone(), row.value()))
        .transpose()
}

/// The head entry of `session` in the reference index of a write transaction
/// ([`EventTables::by_ref`]), read but not yet trusted: `Err` when redb cannot read the table
/// (its I/O or its own corruption, which fail the caller), `Some(Err)` when the entry is no head
/// (which a listing and pruning pass over, decision 0020).
pub(crate) fn head_entry(
    by_ref: &ByRef<'_>,
    session: &SessionRef,
) -> Result<Option<Result<Head, StoreError>>, StoreError> {
    Ok(by_ref
        .get(ref_key(session, HEAD_SEQ).as_slice())
        .ctx("read a head")?
        .map(|row| decode_head(session.clone(), row.value())))
}

/// The encoding of the reference index's key of `session` at `seq` ([`raw::by_ref`]).
fn ref_key(session: &SessionRef, seq: u64) -> Vec<u8> {
    entry_key(session.agent_id.as_str(), session.session_key.as_str(), seq)
}

/// The encoding of the reference index's key `(agent, key, seq)` ([`raw::by_ref`]).
fn entry_key(agent: &str, key: &str, seq: u64) -> Vec<u8> {
    raw::by_ref(agent.as_bytes(), key.as_bytes(), seq)
}

/// Writes a head into the reference index.
pub(crate) fn put_head(by_ref: &mut ByRef<'_>, h: &Head) -> Result<(), StoreError> {
    let row = encode_head(
        h.last_sequence.get(),
        h.pruned_max_sequence.get(),
        h.updated_at.millis(),
    );
    by_ref
        .insert(ref_key(&h.session, HEAD_SEQ).as_slice(), row.as_slice())
        .ctx("write a head")?;
    Ok(())
}

/// Deletes a head; returns whether it existed.
pub(crate) fn remove_head(
    by_ref: &mut ByRef<'_>,
    session: &SessionRef,
) -> Result<bool, StoreError> {
    Ok(by_ref
        .remove(ref_key(session, HEAD_SEQ).as_slice())
        .ctx("delete a head")?
        .is_some())
}

/// Every head, of one agent or all, ordered by key then agent. Heads are not a table of their
/// own: this visits each ref of the reference index with one seek past its entries and one read
/// of its head, two lookups per ref instead of a scan of every event. The keys are read from
/// their bytes ([`EVENTS_BY_REF_KEYS`]): a ref whose text is not UTF-8 is left out like any
/// other head that cannot be read, and a key cut short is passed over, both with a warning
/// rather than a panic in redb's decode. `path`, the store's file, names it in the warnings.
pub(crate) fn list_heads(
    by_ref: &impl ReadableTable<raw::Bytes<RefKey>, &'static [u8]>,
    agent: Option<&str>,
    path: &Path,
) -> Result<Vec<Head>, StoreError> {
    let mut out = Vec::new();
    // The smallest key string above `k` is `k` followed by NUL, so seeking to it skips every
    // entry of the ref `(a, k)` and nothing else.
    let mut from = raw::by_ref(agent.unwrap_or("").as_bytes(), b"", 0);
    loop {
        let mut next = None;
        for item in by_ref.range(from.as_slice()..).ctx("list heads")? {
            let (key, _) = item.ctx("list heads")?;
            if let Some((a, k, _)) = raw::split_ref(key.value()) {
                next = Some((a.to_vec(), k.to_vec()));
                break;
            }
            tracing::warn!(
                path = %path.display(),
                key = ?key.value(),
                "ignoring an entry of the reference index whose key is cut short"
            );
        }
        let Some((a, k)) = next else { break };
        if agent.is_some_and(|x| x.as_bytes() != a) {
            break;
        }
        // A head that cannot be read (a ref this store refuses, text that is not UTF-8, bytes
        // that are no head) is left out with a warning, so that one damaged entry stops no
        // listing of the others (docs/decisions/0020); reading that head by its ref still fails.
        let entry = match ref_of(&k, &a) {
            Ok(session) => by_ref
                .get(raw::by_ref(&a, &k, HEAD_SEQ).as_slice())
                .ctx("read a head")?
                .map(|row| decode_head(session, row.value())),
            Err(e) => Some(Err(e)),
        };
        match entry {
            Some(Ok(h)) => out.push(h),
            None => {}
            Some(Err(e)) => tracing::warn!(
                path = %path.display(),
                session_key = ?String::from_utf8_lossy(&k),
                agent_id = ?String::from_utf8_lossy(&a),
                error = %awareness_core::error::ErrorChain(&e),
                "ignoring a head that cannot be read"
            ),
        }
        let mut past = k;
        past.push(0);
        from = raw::by_ref(&a, &past, 0);
    }
    out.sort_unstable_by(|x, y| {
        (x.session.session_key.as_str(), x.session.agent_id.as_str())
            .cmp(&(y.session.session_key.as_str(), y.session.agent_id.as_str()))
    });
    Ok(out)
}

/// The session ref of a key read as bytes: [`session_ref`], after checking that both are
/// UTF-8.
pub(crate) fn ref_of(key: &[u8], agent: &[u8]) -> Result<SessionRef, StoreError> {
    let text = |what: &str, bytes| {
        std::str::from_utf8(bytes).map_err(|e| corrupt(&format!("stored session ref: {what}"), e))
    };
    session_ref(text("session key", key)?, text("agent", agent)?)
}

/// Moves schema 1's `heads` table into the reference index (under [`HEAD_SEQ`]) and deletes
/// it, in the caller's write transaction (which also writes the new schema version).
///
/// The keys are moved as their bytes ([`raw`]), undecoded: a head whose text is not UTF-8 is
/// moved as it is, and then left out of listings like any head that cannot be read (decision
/// 0020), rather than panicking in redb's decode. A key cut short, which names no ref to move
/// it to, fails the migration with `Corrupt` (the open names the file).
pub(crate) fn migrate_v1(txn: &WriteTransaction) -> Result<u64, StoreError> {
    let mut moved = 0;
    {
        let heads = txn.open_table(HEADS_V1_KEYS).ctx("migrate: open heads")?;
        let mut by_ref = txn
            .open_table(EVENTS_BY_REF_KEYS)
            .ctx("migrate: open events_by_ref")?;
        for item in heads.iter().ctx("migrate: read heads")? {
            let (k, v) = item.ctx("migrate: read heads")?;
            let Some((key, agent)) = raw::split_pair(k.value()) else {
                return Err(StoreError::corrupt(format!(
                    "migrate: a key of the heads table is cut short: {:?}",
                    k.value()
                )));
            };
            let (last, pruned, at) = v.value();
            let row = encode_head(last, pruned, at);
            by_ref
                .insert(raw::by_ref(agent, key, HEAD_SEQ).as_slice(), row.as_slice())
                .ctx("migrate: write a head")?;
            moved += 1;
        }
    }
    txn.delete_table(HEADS_V1).ctx("migrate: delete heads")?;
    Ok(moved)
}

/// The reverse of [`migrate_v1`], for tests: every head back into a `heads` table, out of the
/// reference index, and schema version 1, in the caller's write transaction. Returns how many
/// heads moved.
pub(crate) fn downgrade_to_v1(txn: &WriteTransaction) -> Result<u64, StoreError> {
    let mut found = Vec::new();
    {
        let by_ref = txn
            .open_table(EVENTS_BY_REF)
            .ctx("downgrade: open events_by_ref")?;
        for item in by_ref.iter().ctx("downgrade: read the index")? {
            let (k, v) = item.ctx("downgrade: read the index")?;
            let (agent, key, seq) = k.value();
            if seq == HEAD_SEQ {
                let row = <[u8; HEAD_ROW]>::try_from(v.value())
                    .map_err(|_| StoreError::corrupt("downgrade: a head row of another length"))?;
                let word = |i: usize| -> Result<[u8; 8], StoreError> {
                    Ok(row[i..i + 8].try_into().expect("eight bytes of a head row"))
                };
                found.push((
                    agent.to_owned(),
                    key.to_owned(),
                    (
                        u64::from_le_bytes(word(0)?),
                        u64::from_le_bytes(word(8)?),
                        i64::from_le_bytes(word(16)?),
                    ),
                ));
            }
        }
    }
    let mut by_ref = txn
        .open_table(EVENTS_BY_REF)
        .ctx("downgrade: open events_by_ref")?;
    let mut heads = txn.open_table(HEADS_V1).ctx("downgrade: open heads")?;
    for (agent, key, v) in &found {
        by_ref
            .remove((agent.as_str(), key.as_str(), HEAD_SEQ))
            .ctx("downgrade: remove a head")?;
        heads
            .insert((key.as_str(), agent.as_str()), v)
            .ctx("downgrade: write a head")?;
    }
    txn.open_table(META)
        .ctx("downgrade: the meta table")?
        .insert(SCHEMA_VERSION_KEY, 1)
        .ctx("downgrade: write the schema")?;
    Ok(found.len() as u64)
}

/// A stored cursor, from the bytes of its key (`watcher`, `target`) and of its row: fails with
/// `Corrupt`, naming the cursor, when the row is cut short (or runs long), when any of its text
/// is not UTF-8, or when a key does not parse.
pub(crate) fn cursor_of(watcher: &[u8], target: &[u8], row: &[u8]) -> Result<Cursor, StoreError> {
    let name = || {
        format!(
            "cursor ({:?}, {:?})",
            String::from_utf8_lossy(watcher),
            String::from_utf8_lossy(target)
        )
    };
    let Some(v) = raw::split_cursor_row(row) else {
        return Err(StoreError::corrupt(format!(
            "{}: stored row of {} bytes is cut short or runs long",
            name(),
            row.len()
        )));
    };
    let text = |field: &str, bytes| {
        std::str::from_utf8(bytes).map_err(|e| corrupt(&format!("{}: stored {field}", name()), e))
    };
    let bad = |field: &str, e: awareness_core::ValidationError| {
        corrupt(&format!("{}: stored {field}", name()), e)
    };
    Ok(Cursor {
        watcher: WatcherKey::parse(text("watcher", watcher)?).map_err(|e| bad("watcher", e))?,
        target: SessionKey::new(text("target", target)?).map_err(|e| bad("target", e))?,
        target_agent: AgentId::new(text("agent", v.0)?).map_err(|e| bad("agent", e))?,
        last_seen: Sequence(v.1),
        notified: Sequence(v.2),
        material: Sequence(v.3),
        updated_at: Timestamp(v.4),
        // Only OpenClaw makes ambient cursors, and only in its SQLite file: every cursor a redb
        // store holds is explicit.
        provenance: awareness_core::WatchProvenance::Explicit,
    })
}

/// A stored cursor as every read of many cursors takes it (a listing, a recording's moves, an
/// acknowledgement, a re-freeze): `None`, with a warning naming it, for a row that cannot be
/// read, which is left as it is so that one damaged row stops none of them
/// (docs/decisions/0016). Reading that one cursor ([`cursor_of`]) still fails. `path`, the
/// store's file, names it in the warning.
pub(crate) fn readable_cursor(
    watcher: &[u8],
    target: &[u8],
    row: &[u8],
    path: &Path,
) -> Option<Cursor> {
    cursor_of(watcher, target, row)
        .inspect_err(|e| {
            tracing::warn!(
                path = %path.display(),
                watcher = &*String::from_utf8_lossy(watcher),
                target = &*String::from_utf8_lossy(target),
                error = %awareness_core::error::ErrorChain(e),
                "ignoring a watch cursor that cannot be read"
            );
        })
        .ok()
}

/// An event row about to be deleted.
pub(crate) struct Doomed {
    /// Its ref, whose head's watermark is stamped over it. `None` for a row no entry of the
    /// reference index names, or whose entry names no valid ref (a damaged key): there is no
    /// head to stamp over it (and no reconcile page ever showed it).
    pub session: Option<SessionRef>,
    /// Its entry in the reference index, as (agent, key) as stored, removed with it: `None`
    /// only when no entry names it.
    pub entry: Option<StoredRef>,
    pub seq: u64,
    pub dedupe_key: Option<String>,
    /// The row cannot be read (its bytes do not decode, or its own session's index does not
    /// hold it): its dedupe key is not trusted, and freeing it takes a scan of the dedupe index
    /// ([`EventTables::remove_many`]).
    pub unreadable: bool,
}

/// An event row that cannot be decoded (a torn write, a hand edit), which a transaction is
/// deleting all the same, so that one damaged row stops neither pruning nor the deletion of its
/// session. Kept in [`EventTables::unreadable`] for the caller to log with the file's path.
pub(crate) struct UnreadableRow {
    pub seq: u64,
    /// The refs, as (agent, key), of the index entries under its sequence: its session, found
    /// from the index's keys, which need no decoding (as text, for the warning: a byte that is
    /// not UTF-8 reads as U+FFFD). Empty when no entry names it.
    pub refs: Vec<(String, String)>,
    /// Why it cannot be decoded.
    pub error: StoreError,
}

/// Why a row that decodes is handled as one that cannot be read: no entry of the session it
/// names holds it in the reference index, so its stored ref is not the one the log answers by.
fn not_indexed_error(seq: u64, key: &str, agent: &str) -> StoreError {
    StoreError::corrupt(format!(
        "event row {seq}: names session {key} (agent {agent}), whose reference index has no \
         entry for it"
    ))
}

/// Where a doomed row's entry sits in the reference index (a row no entry names first).
fn index_order(d: &Doomed) -> (Option<&StoredRef>, u64) {
    (d.entry.as_ref(), d.seq)
}

/// The (agent, key) of an entry of the reference index, as stored (bytes).
pub(crate) type StoredRef = (Vec<u8>, Vec<u8>);

/// An entry of the reference index as stored: (agent, key, sequence), the strings as bytes.
type IndexEntry = (Vec<u8>, Vec<u8>, u64);

/// An (agent, key) of the reference index as text, for a warning or an error: a byte that is
/// not UTF-8 reads as U+FFFD.
fn named_ref(agent: &[u8], key: &[u8]) -> (String, String) {
    (
        String::from_utf8_lossy(agent).into_owned(),
        String::from_utf8_lossy(key).into_owned(),
    )
}

/// A table opened on first use: a transaction that does not need it does not pay for opening it.
struct Lazy<'t, K: redb::Key + 'static, V: redb::Value + 'static> {
    def: TableDefinition<'static, K, V>,
    table: Option<Table<'t, K, V>>,
}

impl<'t, K: redb::Key + 'static, V: redb::Value + 'static> Lazy<'t, K, V> {
    fn new(def: TableDefinition<'static, K, V>) -> Self {
        Self { def, table: None }
    }

    fn get(&mut self, txn: &'t WriteTransaction) -> Result<&mut Table<'t, K, V>, StoreError> {
        if self.table.is_none() {
            // The table's name only on failure: this runs in every write transaction.
            let table = txn.open_table(self.def).or_else(|e| {
                Err(e).ctx(&format!(
                    "open the {} table",
                    redb::TableHandle::name(&self.def)
                ))
            })?;
            self.table = Some(table);
        }
        Ok(self.table.as_mut().expect("just opened"))
    }
}

/// The event tables and the counter, opened together in a write transaction (the dedupe index
/// only when used). Opened once per transaction: a group commit's events share them.
pub(crate) struct EventTables<'t> {
    txn: &'t WriteTransaction,
    pub meta: Table<'t, &'static str, u64>,
    pub events: Table<'t, u64, &'static [u8]>,
    /// The reference index, keys as their bytes: the scan for the entries of a row that cannot
    /// be read ([`EventTables::unreadable`]) reads every key, whatever its text.
    pub by_ref: ByRef<'t>,
    /// The dedupe index, keys as their bytes, as [`EventTables::by_ref`].
    dedupe: Lazy<'t, raw::Bytes<&'static str>, u64>,
    /// The counter, once read in this transaction (only this struct moves it).
    counter: Option<u64>,
    /// The rows that cannot be decoded which this transaction deletes (empty on a sound file).
    pub unreadable: Vec<UnreadableRow>,
    /// The keys of the reference index, as stored, that a scan for the entries of such rows
    /// passed over because they are cut short (empty on a sound file); kept, as
    /// [`EventTables::unreadable`], for the caller to log with the file's path.
    pub cut_keys: std::collections::BTreeSet<Vec<u8>>,
}

impl<'t> EventTables<'t> {
    pub(crate) fn open(txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self {
            txn,
            meta: txn.open_table(META).ctx("open the meta table")?,
            events: txn.open_table(EVENTS).ctx("open the events table")?,
            by_ref: txn
                .open_table(EVENTS_BY_REF_KEYS)
                .ctx("open the events_by_ref table")?,
            dedupe: Lazy::new(DEDUPE_KEYS),
            counter: None,
            unreadable: Vec::new(),
            cut_keys: std::collections::BTreeSet::new(),
        })
    }

    /// The dedupe index, keyed by the bytes of each dedupe key.
    pub(crate) fn dedupe(
        &mut self,
    ) -> Result<&mut Table<'t, raw::Bytes<&'static str>, u64>, StoreError> {
        self.dedupe.get(self.txn)
    }

    fn stored_counter(&self) -> Result<u64, StoreError> {
        Ok(self
            .meta
            .get(LAST_SEQUENCE)
            .ctx("read the sequence counter")?
            .map_or(0, |g| g.value()))
    }

    fn last_event(&self) -> Result<u64, StoreError> {
        Ok(self
            .events
            .last()
            .ctx("read the last event")?
            .map_or(0, |(k, _)| k.value()))
    }

    /// The store-wide sequence counter: the highest sequence ever allocated. Read once per
    /// transaction: inserting and consuming move it, and deleting rows never lowers it.
    pub(crate) fn counter(&mut self) -> Result<u64, StoreError> {
        if let Some(c) = self.counter {
            return Ok(c);
        }
        let c = self.stored_counter()?.max(self.last_event()?);
        self.counter = Some(c);
        Ok(c)
    }

    /// Keeps the bounded mode's reservation ahead of the counter (see the module docs): when
    /// this transaction allocated past it, raises it [`RESERVE_AHEAD`] past the counter and
    /// returns `true`: the transaction must then commit durably.
    pub(crate) fn reserve_ahead(&mut self) -> Result<bool, StoreError> {
        let counter = self.counter()?;
        let reserved = self
            .meta
            .get(RESERVED_SEQUENCE)
            .ctx("read the reserved sequence")?
            .map_or(0, |g| g.value());
        if counter <= reserved {
            return Ok(false);
        }
        self.meta
            .insert(
                RESERVED_SEQUENCE,
                counter.saturating_add(RESERVE_AHEAD).min(MAX_EVENT_SEQ),
            )
            .ctx("reserve sequences")?;
        Ok(true)
    }

    /// Records that `seq` was allocated without leaving a row (a dedupe hit, or a move of the
    /// counter by hand: `RedbStore::leave_sequences`).
    pub(crate) fn consume(&mut self, seq: u64) -> Result<(), StoreError> {
        self.meta
            .insert(LAST_SEQUENCE, seq)
            .ctx("move the sequence counter")?;
        self.counter = self.counter.map(|c| c.max(seq));
        Ok(())
    }

    /// Inserts a new event row and its index entries.
    pub(crate) fn insert(&mut self, e: &Event) -> Result<(), StoreError> {
        let seq = e.sequence.get();
        let row = codec::encode(e)?;
        self.events
            .insert(seq, row.as_slice())
            .ctx("insert the event")?;
        self.by_ref
            .insert(
                entry_key(e.agent_id.as_str(), e.session_key.as_str(), seq).as_slice(),
                row.as_slice(),
            )
            .ctx("insert the event")?;
        if let Some(k) = &e.dedupe_key {
            self.dedupe()?
                .insert(k.as_str().as_bytes(), seq)
                .ctx("insert the event")?;
        }
        self.counter = self.counter.map(|c| c.max(seq));
        Ok(())
    }

    /// The stored event of `seq`, when retained.
    pub(crate) fn get(&self, seq: u64) -> Result<Option<Event>, StoreError> {
        match self.events.get(seq).ctx("read an event")? {
            Some(row) => codec::decode(seq, row.value(), None).map(Some),
            None => Ok(None),
        }
    }

    /// Overwrites the row of `seq` and its copy in `events_by_ref` with bytes that do not
    /// decode (`RedbStore::damage_event_row`); touches no index entry or head. Returns whether
    /// the row existed.
    pub(crate) fn damage(&mut self, seq: u64) -> Result<bool, StoreError> {
        const TORN: &[u8] = b"torn";
        let (agent, key) = match self.events.get(seq).ctx("read an event")? {
            Some(row) => {
                let m = codec::meta(seq, row.value())?;
                (m.agent_id.to_owned(), m.session_key.to_owned())
            }
            None => return Ok(false),
        };
        self.by_ref
            .insert(entry_key(&agent, &key, seq).as_slice(), TORN)
            .ctx("damage an event")?;
        self.events.insert(seq, TORN).ctx("damage an event")?;
        Ok(true)
    }

    /// Replaces the first byte of the session key inside the row of `seq` (and its copy in
    /// `events_by_ref`) with 0xFF, so the key is no longer UTF-8 (`RedbStore::spoil_event_text`);
    /// touches no index entry or head. Returns whether the row existed.
    pub(crate) fn spoil_key(&mut self, seq: u64) -> Result<bool, StoreError> {
        let Some((agent, key, mut row)) = self
            .events
            .get(seq)
            .ctx("read an event")?
            .map(|row| -> Result<_, StoreError> {
                let m = codec::meta(seq, row.value())?;
                Ok((
                    m.agent_id.to_owned(),
                    m.session_key.to_owned(),
                    row.value().to_vec(),
                ))
            })
            .transpose()?
        else {
            return Ok(false);
        };
        let at = row
            .windows(key.len())
            .position(|w| w == key.as_bytes())
            .ok_or_else(|| StoreError::corrupt("spoil an event: its key is not in its row"))?;
        row[at] = 0xFF;
        self.by_ref
            .insert(entry_key(&agent, &key, seq).as_slice(), row.as_slice())
            .ctx("spoil an event")?;
        self.events
            .insert(seq, row.as_slice())
            .ctx("spoil an event")?;
        Ok(true)
    }

    /// Deletes one event row with its index entries (and frees its dedupe key); touches no
    /// head. Returns whether the row existed. A row that cannot be decoded is deleted too (see
    /// [`EventTables::unreadable`]).
    pub(crate) fn remove(&mut self, seq: u64) -> Result<bool, StoreError> {
        self.keep_counter_past(seq)?;
        let Some(row) = self.events.remove(seq).ctx("delete an event")? else {
            return Ok(false);
        };
        // A ref that does not parse (damaged key bytes) makes the row unreadable too: the
        // index's key, not the row's, names its entry then.
        let meta = codec::meta(seq, row.value()).and_then(|m| {
            session_ref(m.session_key, m.agent_id)?;
            Ok(m)
        });
        let error = match meta {
            Ok(m) => {
                let indexed = self
                    .by_ref
                    .remove(entry_key(m.agent_id, m.session_key, seq).as_slice())
                    .ctx("delete an event")?
                    .is_some();
                if indexed {
                    let key = m.dedupe_key.map(str::to_owned);
                    drop(row);
                    if let Some(k) = key {
                        self.free_dedupe_key(&k, seq)?;
                    }
                    return Ok(true);
                }
                // The row names a session whose index has no entry for it (its key bytes were
                // edited into another valid key): the index's key is the one to trust.
                not_indexed_error(seq, m.session_key, m.agent_id)
            }
            Err(e) => e,
        };
        drop(row);
        // The row cannot be decoded, so neither its ref nor its dedupe key is known: both are
        // found by scans (see `index_entries_of`), on this damaged path only.
        let seqs = HashSet::from([seq]);
        let refs = self.index_entries_of(&seqs)?;
        for (a, k, s) in &refs {
            self.by_ref
                .remove(raw::by_ref(a, k, *s).as_slice())
                .ctx("delete an unreadable event")?;
        }
        self.free_dedupe_of(&seqs)?;
        self.unreadable.push(UnreadableRow {
            seq,
            refs: refs.iter().map(|(a, k, _)| named_ref(a, k)).collect(),
            error,
        });
        Ok(true)
    }

    /// Deletes the rows `seqs` of `session` (its retained sequences) with their index entries
    /// and dedupe keys; touches no head. Returns whether any row existed. The ref is known, so a
    /// row that cannot be decoded costs no scan of the index, and the dedupe keys of all such
    /// rows are freed by one scan of the dedupe index at the end.
    pub(crate) fn remove_of_session(
        &mut self,
        session: &SessionRef,
        seqs: &[u64],
    ) -> Result<bool, StoreError> {
        let (a, k) = (session.agent_id.as_str(), session.session_key.as_str());
        let mut removed = false;
        let mut unreadable = HashSet::new();
        for &seq in seqs {
            self.keep_counter_past(seq)?;
            removed |= self
                .by_ref
                .remove(entry_key(a, k, seq).as_slice())
                .ctx("delete an event")?
                .is_some();
            let Some(row) = self.events.remove(seq).ctx("delete an event")? else {
                continue;
            };
            removed = true;
            let dedupe_key = match codec::meta(seq, row.value()) {
                Ok(m) => m.dedupe_key.map(str::to_owned),
                Err(error) => {
                    unreadable.insert(seq);
                    self.unreadable.push(UnreadableRow {
                        seq,
                        refs: vec![(a.to_owned(), k.to_owned())],
                        error,
                    });
                    continue;
                }
            };
            drop(row);
            if let Some(key) = dedupe_key {
                self.free_dedupe_key(key.as_str(), seq)?;
            }
        }
        if !unreadable.is_empty() {
            self.free_dedupe_of(&unreadable)?;
        }
        Ok(removed)
    }

    /// The entries of the reference index, as (agent, key, sequence), whose sequence is one of
    /// `seqs`. Only for rows that cannot be decoded, whose ref is then known only from the
    /// index's keys (which need no decoding): it scans the whole index (50,000 entries and the
    /// heads at the default row cap), which is acceptable on this path, taken only on a damaged
    /// file; a sound row's ref is read from the row itself (and checked when its entry is
    /// removed). A head (under [`HEAD_SEQ`]) is never
    /// taken for an event's entry.
    ///
    /// The keys are read from their bytes ([`EVENTS_BY_REF_KEYS`]), and their text is not
    /// decoded: a key whose text is not UTF-8 (a head that listings leave out, decision 0020)
    /// is passed over unless it names one of `seqs`, and then it is returned as it is stored,
    /// so that it is removed with its row. A key cut short, which names no sequence, is passed
    /// over and kept in [`EventTables::cut_keys`] for the caller to log. (redb's decode of such
    /// keys panicked, failing every pass that met a row that cannot be read.)
    fn index_entries_of(&mut self, seqs: &HashSet<u64>) -> Result<Vec<IndexEntry>, StoreError> {
        let mut out = Vec::new();
        for item in self
            .by_ref
            .iter()
            .ctx("find the index entry of an unreadable event")?
        {
            let (key, _) = item.ctx("find the index entry of an unreadable event")?;
            match raw::split_ref(key.value()) {
                Some((a, k, seq)) if seq != HEAD_SEQ && seqs.contains(&seq) => {
                    out.push((a.to_vec(), k.to_vec(), seq));
                }
                Some(_) => {}
                None => {
                    // A set: a pass that scans twice (its choice, then its reindexing) logs it once.
                    self.cut_keys.insert(key.value().to_vec());
                }
            }
        }
        Ok(out)
    }

    /// Keeps the sequence counter at or above `seq` when `seq` is the highest row, which is
    /// about to be deleted: the counter never goes back with it.
    fn keep_counter_past(&mut self, seq: u64) -> Result<(), StoreError> {
        if seq == self.last_event()? {
            let keep = self.stored_counter()?.max(seq);
            self.meta
                .insert(LAST_SEQUENCE, keep)
                .ctx("keep the sequence counter")?;
        }
        Ok(())
    }

    /// Frees the dedupe key `key` of the deleted row `seq`, if it still points at that row.
    fn free_dedupe_key(&mut self, key: &str, seq: u64) -> Result<(), StoreError> {
        let dedupe = self.dedupe()?;
        let points_here = dedupe
            .get(key.as_bytes())
            .ctx("delete an event")?
            .is_some_and(|g| g.value() == seq);
        if points_here {
            dedupe.remove(key.as_bytes()).ctx("delete an event")?;
        }
        Ok(())
    }

    /// The rows of `not_indexed` were deleted by a ref whose index does not hold them: their
    /// doomed entries are replaced by the index entries that do name their sequences, which
    /// are removed (one scan of the index, on this damaged path only).
    fn reindex_doomed(
        &mut self,
        doomed: &mut Vec<Doomed>,
        not_indexed: Vec<(u64, StoreError)>,
    ) -> Result<(), StoreError> {
        let seqs: HashSet<u64> = not_indexed.iter().map(|(seq, _)| *seq).collect();
        let entries = self.index_entries_of(&seqs)?;
        for (a, k, seq) in &entries {
            self.by_ref
                .remove(raw::by_ref(a, k, *seq).as_slice())
                .ctx("delete an event that its session's index does not hold")?;
        }
        doomed.retain(|d| !seqs.contains(&d.seq));
        for (seq, error) in not_indexed {
            self.doom_by_index(doomed, &entries, seq, error);
        }
        Ok(())
    }

    /// Dooms the row `seq`, which cannot be read, once per entry of `entries` (the reference
    /// index's entries under its sequence) and lists it in [`EventTables::unreadable`]; answers
    /// whether any entry names it.
    fn doom_by_index(
        &mut self,
        doomed: &mut Vec<Doomed>,
        entries: &[IndexEntry],
        seq: u64,
        error: StoreError,
    ) -> bool {
        let mut refs = Vec::new();
        for (a, k, _) in entries.iter().filter(|e| e.2 == seq) {
            doomed.push(Doomed {
                session: ref_of(k, a).ok(),
                entry: Some((a.clone(), k.clone())),
                seq,
                dedupe_key: None,
                unreadable: true,
            });
            refs.push(named_ref(a, k));
        }
        let named = !refs.is_empty();
        self.unreadable.push(UnreadableRow { seq, refs, error });
        named
    }

    /// Frees the dedupe keys that point at `seqs`, rows that cannot be decoded and whose keys
    /// are therefore unknown: a scan of the whole dedupe index, on this damaged path only. The
    /// keys are not decoded ([`EventTables::dedupe`]), so one whose text is not UTF-8 is freed
    /// or kept as any other.
    fn free_dedupe_of(&mut self, seqs: &HashSet<u64>) -> Result<(), StoreError> {
        self.dedupe()?
            .retain(|_, seq| !seqs.contains(&seq))
            .ctx("free the dedupe key of an unreadable event")
    }

    /// Reads what deleting `seqs` needs to know (missing rows are skipped), sorted by ref then
    /// sequence: the order of the reference index. A row that cannot be decoded is doomed all
    /// the same, with the ref of the index entry under its sequence (one scan of the index for
    /// all such rows; see [`EventTables::unreadable`]).
    pub(crate) fn doomed(&mut self, seqs: &[u64]) -> Result<Vec<Doomed>, StoreError> {
        let mut out = Vec::with_capacity(seqs.len());
        let mut unreadable = Vec::new();
        for &seq in seqs {
            if let Some(row) = self.events.get(seq).ctx("read an event")? {
                match codec::meta(seq, row.value()) {
                    Ok(m) => match session_ref(m.session_key, m.agent_id) {
                        // Trusted as the row says; a row its own session's index does not
                        // hold (key bytes edited into another valid key) is found when its
                        // entry is removed ([`EventTables::remove_many`]).
                        Ok(session) => out.push(Doomed {
                            entry: Some((
                                m.agent_id.as_bytes().to_vec(),
                                m.session_key.as_bytes().to_vec(),
                            )),
                            session: Some(session),
                            seq,
                            dedupe_key: m.dedupe_key.map(str::to_owned),
                            unreadable: false,
                        }),
                        // A ref that does not parse (damaged key bytes in the row): the row
                        // cannot be read, and the index's key is the one to trust.
                        Err(e) => unreadable.push((seq, e)),
                    },
                    Err(e) => unreadable.push((seq, e)),
                }
            }
        }
        if !unreadable.is_empty() {
            let seqs: HashSet<u64> = unreadable.iter().map(|(seq, _)| *seq).collect();
            let entries = self.index_entries_of(&seqs)?;
            for (seq, error) in unreadable {
                if !self.doom_by_index(&mut out, &entries, seq, error) {
                    out.push(Doomed {
                        session: None,
                        entry: None,
                        seq,
                        dedupe_key: None,
                        unreadable: true,
                    });
                }
            }
        }
        out.sort_unstable_by(|a, b| index_order(a).cmp(&index_order(b)));
        Ok(out)
    }

    /// Deletes many event rows with their index entries (freeing their dedupe keys); touches no
    /// head. The events go in one bulk pass over their sequence range (redb rebuilds each page
    /// once, not once per row); the index entries one by one in index order, so neighbours share
    /// pages. Returns how many rows were deleted.
    ///
    /// A row taken as sound whose own session's index does not hold it (its key bytes were
    /// edited into another valid key) is handled as one that cannot be read: the entries that
    /// do name its sequence are removed, its doomed entries replaced by theirs, and it is
    /// listed in [`EventTables::unreadable`]. So `doomed` is what was really deleted, for the
    /// caller to stamp the watermarks of, once this returns.
    pub(crate) fn remove_many(&mut self, doomed: &mut Vec<Doomed>) -> Result<u64, StoreError> {
        let Some(max) = doomed.iter().map(|d| d.seq).max() else {
            return Ok(0);
        };
        let min = doomed.iter().map(|d| d.seq).min().unwrap_or(max);
        self.keep_counter_past(max)?;
        // A row that cannot be decoded may be doomed once per index entry naming it.
        let set: HashSet<u64> = doomed.iter().map(|d| d.seq).collect();
        self.events
            .retain_in(min..=max, |seq, _| !set.contains(&seq))
            .ctx("delete events")?;
        let mut not_indexed = Vec::new();
        for d in doomed.iter() {
            if let Some((a, k)) = &d.entry {
                let indexed = self
                    .by_ref
                    .remove(raw::by_ref(a, k, d.seq).as_slice())
                    .ctx("delete events")?
                    .is_some();
                if !indexed && !d.unreadable {
                    let (a, k) = named_ref(a, k);
                    not_indexed.push((d.seq, not_indexed_error(d.seq, &k, &a)));
                }
            }
        }
        for d in doomed.iter() {
            if let Some(k) = &d.dedupe_key {
                self.free_dedupe_key(k.as_str(), d.seq)?;
            }
        }
        if !not_indexed.is_empty() {
            self.reindex_doomed(doomed, not_indexed)?;
        }
        let unreadable: HashSet<u64> = doomed
            .iter()
            .filter(|d| d.unreadable)
            .map(|d| d.seq)
            .collect();
        if !unreadable.is_empty() {
            self.free_dedupe_of(&unreadable)?;
        }
        Ok(set.len() as u64)
    }

    /// The retained sequences of one ref, ascending.
    pub(crate) fn sequences_of(&self, r: &SessionRef) -> Result<Vec<u64>, StoreError> {
        let mut out = Vec::new();
        let range = ref_key(r, 0)..ref_key(r, HEAD_SEQ);
        for item in self
            .by_ref
            .range(range.start.as_slice()..range.end.as_slice())
            .ctx("read a session's events")?
        {
            let (key, _) = item.ctx("read a session's events")?;
            // Every key in the range is the ref's own (keys compare as redb's tuple does).
            if let Some((_, _, seq)) = raw::split_ref(key.value()) {
                out.push(seq);
            }
        }
        Ok(out)
    }
}

/// The cursor tables of a write transaction; the cursors themselves are opened on first use (a
/// recording on a session nobody watches only reads the by-target index). Keys and rows are
/// bytes ([`raw`]): a key read back is named again as it is stored, whatever it holds.
pub(crate) struct CursorTables<'t> {
    txn: &'t WriteTransaction,
    cursors: Lazy<'t, PairBytes, CursorRowBytes>,
    pub by_target: Table<'t, PairBytes, ()>,
}

impl<'t> CursorTables<'t> {
    pub(crate) fn open(txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self {
            txn,
            cursors: Lazy::new(CURSORS),
            by_target: txn
                .open_table(CURSORS_BY_TARGET)
                .ctx("open the cursors_by_target table")?,
        })
    }

    /// The cursors table.
    pub(crate) fn cursors(
        &mut self,
    ) -> Result<&mut Table<'t, PairBytes, CursorRowBytes>, StoreError> {
        self.cursors.get(self.txn)
    }

    pub(crate) fn get(
        &mut self,
        watcher: &[u8],
        target: &[u8],
    ) -> Result<Option<Cursor>, StoreError> {
        match self
            .cursors()?
            .get(raw::pair(watcher, target).as_slice())
            .ctx("read a cursor")?
        {
            Some(v) => cursor_of(watcher, target, v.value()).map(Some),
            None => Ok(None),
        }
    }

    /// One cursor as [`readable_cursor`] takes it: `None` for a row that cannot be read, with a
    /// warning naming the store's file (`path`).
    pub(crate) fn get_readable(
        &mut self,
        watcher: &[u8],
        target: &[u8],
        path: &Path,
    ) -> Result<Option<Cursor>, StoreError> {
        Ok(self
            .cursors()?
            .get(raw::pair(watcher, target).as_slice())
            .ctx("read a cursor")?
            .and_then(|v| readable_cursor(watcher, target, v.value(), path)))
    }

    /// Rewrites one cursor row's target agent with `agent(old)` (`RedbStore::damage_cursor_row`,
    /// `RedbStore::spoil_cursor_text`), its sequences kept (zeros for a row cut short); `false`
    /// when there is no such row.
    pub(crate) fn rewrite_agent(
        &mut self,
        watcher: &str,
        target: &str,
        agent: impl FnOnce(&[u8]) -> Vec<u8>,
    ) -> Result<bool, StoreError> {
        let key = raw::pair(watcher.as_bytes(), target.as_bytes());
        let table = self.cursors()?;
        let Some(row) = table.get(key.as_slice()).ctx("damage a cursor")?.map(|v| {
            let (old, last, notified, material, at) =
                raw::split_cursor_row(v.value()).unwrap_or((b"", 0, 0, 0, 0));
            raw::cursor_row(&agent(old), last, notified, material, at)
        }) else {
            return Ok(false);
        };
        table
            .insert(key.as_slice(), row.as_slice())
            .ctx("damage a cursor")?;
        Ok(true)
    }

    /// Moves one cursor row, with its by-target entry, to the watcher key `watcher` followed by
    /// a byte that is not UTF-8 (`RedbStore::spoil_cursor_watcher`); `false` when there is no
    /// such row.
    pub(crate) fn spoil_watcher(
        &mut self,
        watcher: &str,
        target: &str,
    ) -> Result<bool, StoreError> {
        let (w, t) = (watcher.as_bytes(), target.as_bytes());
        let Some(row) = self
            .cursors()?
            .remove(raw::pair(w, t).as_slice())
            .ctx("spoil a cursor")?
            .map(|v| v.value().to_vec())
        else {
            return Ok(false);
        };
        self.by_target
            .remove(raw::pair(t, w).as_slice())
            .ctx("spoil a cursor")?;
        let spoiled = [w, b"\xFF".as_slice()].concat();
        self.cursors()?
            .insert(raw::pair(&spoiled, t).as_slice(), row.as_slice())
            .ctx("spoil a cursor")?;
        self.by_target
            .insert(raw::pair(t, &spoiled).as_slice(), ())
            .ctx("spoil a cursor")?;
        Ok(true)
    }

    pub(crate) fn put(&mut self, c: &Cursor) -> Result<(), StoreError> {
        // The row has no room for the provenance: only OpenClaw makes ambient cursors, and only
        // in its SQLite file (decision 0015), so nothing this store reads or computes is one.
        debug_assert_eq!(
            c.provenance,
            awareness_core::WatchProvenance::Explicit,
            "store-redb holds explicit cursors only"
        );
        let (w, t) = (c.watcher.as_str().as_bytes(), c.target.as_str().as_bytes());
        let row = raw::cursor_row(
            c.target_agent.as_str().as_bytes(),
            c.last_seen.get(),
            c.notified.get(),
            c.material.get(),
            c.updated_at.millis(),
        );
        let existed = self
            .cursors()?
            .insert(raw::pair(w, t).as_slice(), row.as_slice())
            .ctx("write a cursor")?
            .is_some();
        // An update leaves the index entry as it is (every write costs a page copy).
        if !existed {
            self.by_target
                .insert(raw::pair(t, w).as_slice(), ())
                .ctx("write a cursor")?;
        }
        Ok(())
    }

    pub(crate) fn remove(&mut self, watcher: &[u8], target: &[u8]) -> Result<bool, StoreError> {
        let existed = self
            .cursors()?
            .remove(raw::pair(watcher, target).as_slice())
            .ctx("delete a cursor")?
            .is_some();
        self.by_target
            .remove(raw::pair(target, watcher).as_slice())
            .ctx("delete a cursor")?;
        Ok(existed)
    }

    /// Every cursor whose target key is `target` (of any agent), ordered by watcher; a row that
    /// cannot be read is left out with a warning naming the store's file (`path`,
    /// [`readable_cursor`]).
    pub(crate) fn on_target(
        &mut self,
        target: &str,
        path: &Path,
    ) -> Result<Vec<Cursor>, StoreError> {
        let mut out = Vec::new();
        for w in watchers_of(&self.by_target, target.as_bytes())? {
            if let Some(c) = self.get_readable(&w, target.as_bytes(), path)? {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// The target keys `watcher` watches, as stored (bytes, so that a key that is not UTF-8
    /// can still be removed).
    pub(crate) fn targets_of(&mut self, watcher: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut out = Vec::new();
        let from = raw::pair(watcher, b"");
        for item in self
            .cursors()?
            .range(from.as_slice()..)
            .ctx("read cursors")?
        {
            let (k, _) = item.ctx("read cursors")?;
            // A key cut short cannot be told to be this watcher's: passed over.
            let Some((w, t)) = raw::split_pair(k.value()) else {
                continue;
            };
            if w != watcher {
                break;
            }
            out.push(t.to_vec());
        }
        Ok(out)
    }
}

/// The watchers with a cursor on `target`, from the by-target index, as stored (bytes: a watcher
/// key that is not UTF-8 still names its row, which a deletion of the target removes).
pub(crate) fn watchers_of(
    by_target: &impl ReadableTable<PairBytes, ()>,
    target: &[u8],
) -> Result<Vec<Vec<u8>>, StoreError> {
    let mut out = Vec::new();
    let from = raw::pair(target, b"");
    for item in by_target.range(from.as_slice()..).ctx("read cursors")? {
        let (k, _) = item.ctx("read cursors")?;
        // A key cut short cannot be told to be this target's: passed over.
        let Some((t, w)) = raw::split_pair(k.value()) else {
            continue;
        };
        if t != target {
            break;
        }
        out.push(w.to_vec());
    }
    Ok(out)
}

/// At a read-write open: settles a reservation the last writer left (see the module docs),
/// moving the counter up to it, and removes it. Returns whether it wrote anything.
pub(crate) fn settle_reservation(txn: &WriteTransaction) -> Result<bool, StoreError> {
    let mut t = EventTables::open(txn)?;
    let Some(reserved) = t
        .meta
        .remove(RESERVED_SEQUENCE)
        .ctx("read the reserved sequence")?
        .map(|g| g.value())
    else {
        return Ok(false);
    };
    if reserved > t.counter()? {
        t.meta
            .insert(LAST_SEQUENCE, reserved)
            .ctx("move the sequence counter past the reservation")?;
    }
    Ok(true)
}

/// At a clean close: removes the reservation, so that the next open continues from the
/// counter. Returns whether there was one.
pub(crate) fn drop_reservation(txn: &WriteTransaction) -> Result<bool, StoreError> {
    Ok(txn
        .open_table(META)
        .ctx("open the meta table")?
        .remove(RESERVED_SEQUENCE)
        .ctx("remove the reserved sequence")?
        .is_some())
}
