//! A ready in-memory [`SessionDirectory`] and a spawn-tree [`VisibilityPolicy`] over any
//! directory.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use awareness_core::{SessionKey, SessionRef};

use crate::ports::{SessionDirectory, SessionEntry, VisibilityPolicy};

/// Sessions known to the gateway, in memory.
#[derive(Debug, Default)]
pub struct InMemoryDirectory {
    sessions: RwLock<HashMap<SessionKey, SessionEntry>>,
}

impl InMemoryDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a session.
    pub fn upsert(&self, session: SessionKey, entry: SessionEntry) {
        self.sessions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session, entry);
    }

    /// Removes a session.
    pub fn remove(&self, session: &SessionKey) {
        self.sessions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(session);
    }
}

impl SessionDirectory for InMemoryDirectory {
    fn exists(&self, session: &SessionKey) -> bool {
        self.entry(session).is_some()
    }

    fn entry(&self, session: &SessionKey) -> Option<SessionEntry> {
        self.sessions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(session)
            .cloned()
    }
}

/// A requester sees itself, the sessions it spawned (transitively) and the sessions that spawned
/// it (its ancestors), following `spawned_by` / `parent_session_key` in the directory.
pub struct SpawnTree {
    directory: Arc<dyn SessionDirectory>,
}

impl std::fmt::Debug for SpawnTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnTree").finish_non_exhaustive()
    }
}

/// How deep a spawn chain is followed.
const MAX_DEPTH: usize = 32;

impl SpawnTree {
    /// A policy over a directory.
    pub fn new(directory: Arc<dyn SessionDirectory>) -> Self {
        Self { directory }
    }

    fn is_ancestor(&self, ancestor: &SessionKey, of: &SessionKey) -> bool {
        let mut cur = of.clone();
        for _ in 0..MAX_DEPTH {
            let Some(e) = self.directory.entry(&cur) else {
                return false;
            };
            let Some(up) = e.spawned_by.or(e.parent_session_key) else {
                return false;
            };
            if &up == ancestor {
                return true;
            }
            cur = up;
        }
        false
    }
}

impl VisibilityPolicy for SpawnTree {
    fn can_see(&self, requester: &SessionRef, target: &SessionRef) -> bool {
        // Itself: the same key of the same agent (another agent's `global` is not).
        if requester == target {
            return true;
        }
        let (requester, t) = (&requester.session_key, &target.session_key);
        // The target's agent must be the one its key names (a bare key belongs to no tree).
        if t.agent_id().is_some_and(|a| a != target.agent_id.as_str()) {
            return false;
        }
        self.is_ancestor(requester, t) || self.is_ancestor(t, requester)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_tree_visibility() {
        let dir = Arc::new(InMemoryDirectory::new());
        let k = |s: &str| SessionKey::new(s).unwrap();
        dir.upsert(k("agent:main:main"), SessionEntry::default());
        dir.upsert(
            k("agent:main:subagent:a"),
            SessionEntry {
                spawned_by: Some(k("agent:main:main")),
                ..SessionEntry::default()
            },
        );
        dir.upsert(
            k("agent:main:subagent:a:subagent:b"),
            SessionEntry {
                spawned_by: Some(k("agent:main:subagent:a")),
                ..SessionEntry::default()
            },
        );
        dir.upsert(k("agent:ops:main"), SessionEntry::default());
        let p = SpawnTree::new(dir);
        let r = |s: &str, a: &str| SessionRef::parse(s, a).unwrap();
        let main = r("agent:main:main", "main");
        let ops = r("agent:ops:main", "ops");
        assert!(p.can_see(&main, &r("agent:main:subagent:a:subagent:b", "main")));
        assert!(p.can_see(
            &r("agent:main:subagent:a:subagent:b", "main"),
            &r("agent:main:main", "main")
        ));
        assert!(!p.can_see(&ops, &r("agent:main:subagent:a", "main")));
        assert!(!p.can_see(&ops, &main));
        assert!(p.can_see(&ops, &ops));
        // Its own key of another agent is not itself.
        assert!(!p.can_see(&main, &r("agent:main:main", "ops")));
        assert!(p.can_see(&r("global", "main"), &r("global", "main")));
        assert!(!p.can_see(&r("global", "main"), &r("global", "ops")));
    }
}
