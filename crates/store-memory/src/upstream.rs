//! [`UpstreamStore`] in memory: a `BTreeMap` by ref under the store's one lock, so the order of
//! [`UpstreamStore::links`] is the ref's (key, then agent). Every decision is `awareness_core`'s
//! ([`upstream::plan_upsert`], [`upstream::plan_set_marker`], [`upstream::may_remove`]).

use awareness_core::upstream::{self, LinkSpec, UpsertOutcome, UpstreamLink, UpstreamStore};
use awareness_core::{SessionRef, StoreError, Timestamp, async_trait};
use serde_json::Value;

use crate::MemoryStore;

#[async_trait]
impl UpstreamStore for MemoryStore {
    async fn upsert_link(
        &self,
        spec: LinkSpec,
        now: Timestamp,
    ) -> Result<UpsertOutcome, StoreError> {
        let mut g = self.lock();
        let plan = upstream::plan_upsert(g.links.get(&spec.session), spec, now)?;
        if plan.write {
            g.links
                .insert(plan.outcome.link.session.clone(), plan.outcome.link.clone());
        }
        Ok(plan.outcome)
    }

    async fn link(&self, session: &SessionRef) -> Result<Option<UpstreamLink>, StoreError> {
        Ok(self.lock().links.get(session).cloned())
    }

    async fn links(&self) -> Result<Vec<UpstreamLink>, StoreError> {
        Ok(self.lock().links.values().cloned().collect())
    }

    async fn set_marker(
        &self,
        session: &SessionRef,
        expected_updated_at: Timestamp,
        marker: Value,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        upstream::validate_json("marker", Some(&marker))?;
        let mut g = self.lock();
        let Some(next) = g
            .links
            .get(session)
            .and_then(|l| upstream::plan_set_marker(l, expected_updated_at, marker, now))
        else {
            return Ok(false);
        };
        g.links.insert(session.clone(), next);
        Ok(true)
    }

    async fn mark_scanned(&self, session: &SessionRef, now: Timestamp) -> Result<bool, StoreError> {
        Ok(self
            .lock()
            .links
            .get_mut(session)
            .map(|l| l.last_scanned_at = Some(now))
            .is_some())
    }

    async fn remove_link(
        &self,
        session: &SessionRef,
        expected_updated_at: Option<Timestamp>,
    ) -> Result<bool, StoreError> {
        let mut g = self.lock();
        if !g
            .links
            .get(session)
            .is_some_and(|l| upstream::may_remove(l, expected_updated_at))
        {
            return Ok(false);
        }
        Ok(g.links.remove(session).is_some())
    }
}
