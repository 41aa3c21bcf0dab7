//! [`UpstreamStore`] for [`SqliteStore`]: the links of adopted sessions in OpenClaw's
//! `session_upstream_links`. Every decision (same-source refresh, rebase, compare-and-set of
//! the marker, conditional removal) is `awareness_core::upstream`'s; each write reads the link
//! and writes what core decided in one `BEGIN IMMEDIATE` transaction.
//!
//! A row that cannot be read as a link (decision 0017), text that is not UTF-8 among them, is
//! left out of [`UpstreamStore::links`] with a warning, fails a read or a marker update of its
//! ref with `Corrupt`, is written over by an adoption of its ref, and is removed by an
//! unconditional removal.

use awareness_core::upstream::{self, LinkSpec, UpsertOutcome, UpstreamLink, UpstreamStore};
use awareness_core::{SessionRef, StoreError, Timestamp, async_trait};
use serde_json::Value;
use sqlx::SqliteConnection;

use crate::conn::{batch, batch_one, get};
use crate::{SqliteStore, decode, sql};

/// The current link of `session`, read inside the write transaction (begins it): `None`
/// without a row, the row's own error when it cannot be read as a link.
async fn begin_with_link(
    conn: &mut SqliteConnection,
    session: &SessionRef,
    what: &str,
) -> Result<Option<Result<UpstreamLink, StoreError>>, StoreError> {
    let q = sqlx::query(sql::LINK_BEGIN)
        .bind(session.session_key.as_str())
        .bind(session.agent_id.as_str());
    let row = batch_one(conn, q, what).await?;
    let text: Option<&[u8]> = get(&row, 0, what)?;
    Ok(text.map(link_of))
}

/// One link from the bytes of its `link_json!` (SQLite hands back text that is not UTF-8 as it
/// is, and such a row is unreadable, not a failed read).
fn link_of(bytes: &[u8]) -> Result<UpstreamLink, StoreError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| StoreError::corrupt(format!("upstream link: text that is not UTF-8 ({e})")))?;
    decode::one_link(text)
}

/// Writes `link` whole and commits.
async fn put_link_commit(
    conn: &mut SqliteConnection,
    link: &UpstreamLink,
    what: &str,
) -> Result<(), StoreError> {
    let json = |v: &Option<Value>| v.as_ref().map(decode::to_json);
    let q = sqlx::query(sql::PUT_LINK_COMMIT)
        .bind(link.session.session_key.as_str())
        .bind(link.session.agent_id.as_str())
        .bind(link.catalog_id.as_str())
        .bind(link.host_id.as_str())
        .bind(link.thread_id.as_str())
        .bind(link.upstream_kind.as_str())
        .bind(json(&link.upstream_ref))
        .bind(json(&link.marker))
        .bind(link.last_scanned_at.map(Timestamp::millis))
        .bind(link.created_at.millis())
        .bind(link.updated_at.millis());
    batch(conn, q, what).await.map(drop)
}

async fn commit(conn: &mut SqliteConnection, what: &str) -> Result<(), StoreError> {
    batch(conn, sqlx::query(sql::COMMIT), what).await.map(drop)
}

// Every error the methods return names the file: each one's work is done by the inherent
// method of the same name with `_inner` (below), whose result goes through `named`.
#[async_trait]
impl UpstreamStore for SqliteStore {
    async fn upsert_link(
        &self,
        spec: LinkSpec,
        now: Timestamp,
    ) -> Result<UpsertOutcome, StoreError> {
        self.named(self.upsert_link_inner(spec, now).await)
    }

    async fn link(&self, session: &SessionRef) -> Result<Option<UpstreamLink>, StoreError> {
        self.named(self.link_inner(session).await)
    }

    async fn links(&self) -> Result<Vec<UpstreamLink>, StoreError> {
        self.named(self.links_inner().await)
    }

    async fn set_marker(
        &self,
        session: &SessionRef,
        expected_updated_at: Timestamp,
        marker: Value,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.named(
            self.set_marker_inner(session, expected_updated_at, marker, now)
                .await,
        )
    }

    async fn mark_scanned(&self, session: &SessionRef, now: Timestamp) -> Result<bool, StoreError> {
        self.named(self.mark_scanned_inner(session, now).await)
    }

    async fn remove_link(
        &self,
        session: &SessionRef,
        expected_updated_at: Option<Timestamp>,
    ) -> Result<bool, StoreError> {
        self.named(self.remove_link_inner(session, expected_updated_at).await)
    }
}

// The work of the `UpstreamStore` methods, whose errors do not name the file yet.
impl SqliteStore {
    async fn upsert_link_inner(
        &self,
        spec: LinkSpec,
        now: Timestamp,
    ) -> Result<UpsertOutcome, StoreError> {
        const WHAT: &str = "adopt a session (upstream link)";
        spec.validate()?;
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let found = begin_with_link(&mut w.conn, &spec.session, WHAT).await?;
            let (existing, unreadable) = upstream::adopting_over(found);
            if let Some(e) = unreadable {
                tracing::warn!(path = %self.path.display(), session_key = %spec.session.session_key, agent_id = %spec.session.agent_id, error = %awareness_core::error::ErrorChain(&e), "adopting over an upstream link that cannot be read");
            }
            let plan = upstream::plan_upsert(existing.as_ref(), spec, now)?;
            if plan.write {
                put_link_commit(&mut w.conn, &plan.outcome.link, WHAT).await?;
            } else {
                commit(&mut w.conn, WHAT).await?;
            }
            Ok(plan.outcome)
        }
        .await;
        w.finish(res).await
    }

    async fn link_inner(&self, session: &SessionRef) -> Result<Option<UpstreamLink>, StoreError> {
        const WHAT: &str = "read an upstream link";
        let q = sqlx::query(sql::LINK)
            .bind(session.session_key.as_str())
            .bind(session.agent_id.as_str());
        let mut conn = self.reader().await;
        let rows = batch(&mut conn, q, WHAT).await?;
        match rows.first() {
            Some(row) => link_of(get(row, 0, WHAT)?).map(Some),
            None => Ok(None),
        }
    }

    async fn links_inner(&self) -> Result<Vec<UpstreamLink>, StoreError> {
        const WHAT: &str = "list upstream links";
        let row = self.read_one(sqlx::query(sql::LINKS), WHAT).await?;
        let all: &[u8] = get(&row, 0, WHAT)?;
        let found = if let Ok(text) = std::str::from_utf8(all) {
            decode::links(text)?
        } else {
            // A row holds text that is not UTF-8, which SQLite copies into the array as it is:
            // the rows one by one, so that only that row is unreadable.
            let mut conn = self.reader().await;
            batch(&mut conn, sqlx::query(sql::LINKS_EACH), WHAT)
                .await?
                .iter()
                .map(|row| {
                    let (key, agent, link): (&[u8], &[u8], &[u8]) =
                        (get(row, 0, WHAT)?, get(row, 1, WHAT)?, get(row, 2, WHAT)?);
                    match std::str::from_utf8(link) {
                        Ok(text) => decode::one_link(text),
                        Err(e) => Err(StoreError::corrupt(format!(
                            "upstream link ({:?}, {:?}): text that is not UTF-8 ({e})",
                            String::from_utf8_lossy(key),
                            String::from_utf8_lossy(agent)
                        ))),
                    }
                })
                .collect()
        };
        Ok(found
            .into_iter()
            .filter_map(|found| {
                found
                    .inspect_err(|e| {
                        tracing::warn!(path = %self.path.display(), error = %awareness_core::error::ErrorChain(e), "ignoring an upstream link that cannot be read");
                    })
                    .ok()
            })
            .collect())
    }

    async fn set_marker_inner(
        &self,
        session: &SessionRef,
        expected_updated_at: Timestamp,
        marker: Value,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        const WHAT: &str = "move an upstream marker";
        upstream::validate_json("marker", Some(&marker))?;
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let next = begin_with_link(&mut w.conn, session, WHAT)
                .await?
                .transpose()?
                .and_then(|link| {
                    upstream::plan_set_marker(&link, expected_updated_at, marker, now)
                });
            let written = next.is_some();
            match next {
                Some(link) => put_link_commit(&mut w.conn, &link, WHAT).await?,
                None => commit(&mut w.conn, WHAT).await?,
            }
            Ok(written)
        }
        .await;
        w.finish(res).await
    }

    async fn mark_scanned_inner(
        &self,
        session: &SessionRef,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        const WHAT: &str = "stamp an upstream scan";
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let q = sqlx::query(sql::MARK_SCANNED)
                .bind(session.session_key.as_str())
                .bind(session.agent_id.as_str())
                .bind(now.millis());
            let row = batch_one(&mut w.conn, q, WHAT).await?;
            Ok(get::<i64>(&row, 0, WHAT)? > 0)
        }
        .await;
        w.finish(res).await
    }

    async fn remove_link_inner(
        &self,
        session: &SessionRef,
        expected_updated_at: Option<Timestamp>,
    ) -> Result<bool, StoreError> {
        const WHAT: &str = "remove an upstream link";
        let mut w = self.writer(WHAT).await?;
        let res = async {
            let found = begin_with_link(&mut w.conn, session, WHAT).await?;
            let remove = upstream::may_remove_found(found, expected_updated_at)?;
            let q = if remove {
                sqlx::query(sql::DELETE_LINK_COMMIT)
                    .bind(session.session_key.as_str())
                    .bind(session.agent_id.as_str())
            } else {
                sqlx::query(sql::COMMIT)
            };
            batch(&mut w.conn, q, WHAT).await?;
            Ok(remove)
        }
        .await;
        w.finish(res).await
    }
}
