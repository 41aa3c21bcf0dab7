//! [`CursorStore`] for [`SqliteStore`]: watch, acknowledge, re-freeze, reset.

use std::collections::BTreeMap;

use awareness_core::{
    AckTarget, Cursor, CursorFilter, CursorKey, CursorStore, Notice, Sequence, SessionKey,
    SessionRef, StoreError, Timestamp, UnreadableCursor, WatcherKey, async_trait, protocol,
};

use crate::conn::{batch, batch_one, get, persist_cursors};
use crate::decode::{self};
use crate::{SqliteStore, sql};

/// Applies `decide` to each listed target's cursor in order, with what the list says of that
/// key, and collects what to write. The callers list each key once ([`protocol::each_once`],
/// [`AckTarget::each_once`]); a key listed again would see the cursor the previous step wrote.
fn apply_in_order<'k, X>(
    loaded: Vec<Cursor>,
    keys: impl IntoIterator<Item = (&'k WatcherKey, &'k SessionKey, X)>,
    mut decide: impl FnMut(&Cursor, X) -> (Option<Cursor>, Option<Notice>),
) -> (Vec<Cursor>, Vec<Notice>) {
    let mut current: BTreeMap<CursorKey, Cursor> =
        loaded.into_iter().map(|c| (c.key(), c)).collect();
    let mut written: BTreeMap<CursorKey, Cursor> = BTreeMap::new();
    let mut notices = Vec::new();
    for (w, t, x) in keys {
        let key = CursorKey {
            watcher: w.clone(),
            target: t.clone(),
        };
        let Some(c) = current.get(&key) else { continue };
        let (write, notice) = decide(c, x);
        if let Some(c) = write {
            current.insert(key.clone(), c.clone());
            written.insert(key, c);
        }
        notices.extend(notice);
    }
    (written.into_values().collect(), notices)
}

// Every error the methods return names the file: each one's work is done by the inherent
// method of the same name with `_inner` (below), whose result goes through `named`.
#[async_trait]
impl CursorStore for SqliteStore {
    async fn watch(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError> {
        self.named(self.watch_inner(watcher, target, now).await)
    }

    async fn unwatch(&self, watcher: &WatcherKey, target: &SessionKey) -> Result<bool, StoreError> {
        self.named(self.unwatch_inner(watcher, target).await)
    }

    async fn acknowledge(
        &self,
        watcher: &WatcherKey,
        targets: &[AckTarget],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        self.named(self.acknowledge_inner(watcher, targets, now).await)
    }

    async fn cursor(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError> {
        self.named(self.cursor_inner(watcher, target).await)
    }

    async fn cursors(&self, filter: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        self.named(self.cursors_inner(filter).await)
    }

    async fn unreadable_cursors(&self) -> Result<Vec<UnreadableCursor>, StoreError> {
        self.named(self.unreadable_cursors_inner().await)
    }

    async fn refreeze(
        &self,
        keys: &[CursorKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        self.named(self.refreeze_inner(keys, now).await)
    }

    async fn reset_watcher(&self, watcher: &SessionKey) -> Result<u64, StoreError> {
        self.named(self.reset_watcher_inner(watcher).await)
    }
}

// The work of the `CursorStore` methods, whose errors do not name the file yet.
impl SqliteStore {
    async fn watch_inner(
        &self,
        watcher: &WatcherKey,
        target: &SessionRef,
        now: Timestamp,
    ) -> Result<Cursor, StoreError> {
        const WHAT: &str = "watch";
        protocol::check_watch(watcher.session_key(), &target.session_key)?;
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let q = sqlx::query(sql::WATCH_BEGIN)
                .bind(watcher.as_str().to_owned())
                .bind(target.session_key.as_str().to_owned())
                .bind(target.agent_id.as_str().to_owned());
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            let existing: Option<&[u8]> = get(&row, 0, WHAT)?;
            // A row that cannot be read is watched over as if there were none (decision 0016).
            let existing = existing.and_then(|text| {
                decode::one_cursor(text)
                    .inspect_err(|e| {
                        tracing::warn!(path = %self.path.display(), watcher = %watcher, target = %target.session_key, agent_id = %target.agent_id, error = %awareness_core::error::ErrorChain(e), "replacing a watch cursor that cannot be read");
                    })
                    .ok()
            });
            let head: Option<i64> = get(&row, 1, WHAT)?;
            let head = head
                .map(|h| decode::sequence(WHAT, h))
                .transpose()?
                .unwrap_or(Sequence::ZERO);
            let (cursor, write) = protocol::watch(existing.as_ref(), watcher, target, head, now);
            self.hints.set_watched(&target.session_key, true);
            let upserts = if write {
                std::slice::from_ref(&cursor)
            } else {
                &[]
            };
            persist_cursors(&mut w.conn, upserts, WHAT).await?;
            Ok(cursor)
        }
        .await;
        w.finish(res).await
    }

    async fn unwatch_inner(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(sql::UNWATCH)
            .bind(watcher.as_str().to_owned())
            .bind(target.as_str().to_owned());
        self.write_changed("unwatch", q).await
    }

    async fn acknowledge_inner(
        &self,
        watcher: &WatcherKey,
        targets: &[AckTarget],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        const WHAT: &str = "acknowledge";
        // A read-only handle refuses even a call with nothing to do.
        self.write_connection(WHAT)?;
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<&str> = targets.iter().map(|t| t.target.as_str()).collect();
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let q = sqlx::query(sql::ACK_BEGIN)
                .bind(watcher.as_str().to_owned())
                .bind(decode::to_json(&names));
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            let loaded = decode::cursors(get(&row, 0, WHAT)?, &self.path)?;
            let (writes, notices) = apply_in_order(
                loaded,
                AckTarget::each_once(targets).map(|t| (watcher, &t.target, t)),
                |c, t| t.apply(c, now),
            );
            persist_cursors(&mut w.conn, &writes, WHAT).await?;
            Ok(notices)
        }
        .await;
        w.finish(res).await
    }

    async fn cursor_inner(
        &self,
        watcher: &WatcherKey,
        target: &SessionKey,
    ) -> Result<Option<Cursor>, StoreError> {
        const WHAT: &str = "read a cursor";
        let q = sqlx::query(sql::CURSOR)
            .bind(watcher.as_str().to_owned())
            .bind(target.as_str().to_owned());
        let mut conn = self.reader().await;
        let rows = batch(&mut conn, q, WHAT).await?;
        match rows.first() {
            Some(row) => decode::one_cursor(get(row, 0, WHAT)?).map(Some),
            None => Ok(None),
        }
    }

    async fn cursors_inner(&self, filter: &CursorFilter) -> Result<Vec<Cursor>, StoreError> {
        const WHAT: &str = "list cursors";
        let owned = |k: &SessionKey| k.as_str().to_owned();
        let q = match (&filter.watcher, &filter.target) {
            (None, None) => sqlx::query(sql::CURSORS),
            (Some(w), None) => sqlx::query(sql::CURSORS_OF_WATCHER).bind(owned(w)),
            (None, Some(t)) => sqlx::query(sql::CURSORS_ON_TARGET).bind(owned(t)),
            (Some(w), Some(t)) => sqlx::query(sql::CURSORS_OF_PAIR)
                .bind(owned(w))
                .bind(owned(t)),
        }
        .bind(filter.pending_only);
        let row = self.read_one(q, WHAT).await?;
        let mut all = decode::cursors(get(&row, 0, WHAT)?, &self.path)?;
        // The statement leaves out what is not pending (building rows is the cost); the rule
        // is core's, applied here again.
        all.retain(|c| filter.matches(c));
        Ok(all)
    }

    async fn unreadable_cursors_inner(&self) -> Result<Vec<UnreadableCursor>, StoreError> {
        const WHAT: &str = "list unreadable cursors";
        let q = sqlx::query(sql::CURSORS).bind(false);
        let row = self.read_one(q, WHAT).await?;
        Ok(decode::CursorRows::read(get(&row, 0, WHAT)?)?.unreadable)
    }

    async fn refreeze_inner(
        &self,
        keys: &[CursorKey],
        now: Timestamp,
    ) -> Result<Vec<Notice>, StoreError> {
        const WHAT: &str = "re-freeze cursors";
        self.write_connection(WHAT)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let pairs: Vec<(&str, &str)> = keys
            .iter()
            .map(|k| (k.watcher.as_str(), k.target.as_str()))
            .collect();
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let q = sqlx::query(sql::REFREEZE_BEGIN).bind(decode::to_json(&pairs));
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            let loaded = decode::cursors(get(&row, 0, WHAT)?, &self.path)?;
            let (writes, notices) = apply_in_order(
                loaded,
                protocol::each_once(keys).map(|k| (&k.watcher, &k.target, ())),
                |c, ()| match protocol::refreeze(c, now) {
                    Some((write, n)) => (write, Some(n)),
                    None => (None, None),
                },
            );
            persist_cursors(&mut w.conn, &writes, WHAT).await?;
            Ok(notices)
        }
        .await;
        w.finish(res).await
    }

    async fn reset_watcher_inner(&self, watcher: &SessionKey) -> Result<u64, StoreError> {
        const WHAT: &str = "reset a watcher";
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let q = sqlx::query(sql::RESET_WATCHER).bind(watcher.as_str().to_owned());
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            Ok(decode::sequence(WHAT, get(&row, 0, WHAT)?)?.get())
        }
        .await;
        w.finish(res).await
    }
}
