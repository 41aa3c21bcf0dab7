//! A ready in-memory [`SessionDirectory`] and a spawn-tree [`VisibilityPolicy`] over any
//! directory.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use awareness_core::{AgentId, SessionKey, SessionRef};

use crate::ports::{SessionDirectory, SessionEntry, VisibilityPolicy};

/// Sessions known to the gateway, in memory.
#[derive(Debug, Default)]
pub struct InMemoryDirectory {
    sessions: RwLock<HashMap<SessionKey, SessionEntry>>,
    /// The agents whose bare-key sessions are the gateway's, when not every agent's.
    hosted: Option<HashSet<AgentId>>,
}

impl InMemoryDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty directory of a gateway that hosts only `agents`: a session is its own only as
    /// one of those agents' ([`SessionDirectory::exists_as`]), under a bare key (`global`) as
    /// under an agent-qualified one (whose ref may name another agent than its key does).
    pub fn hosting(agents: impl IntoIterator<Item = AgentId>) -> Self {
        Self {
            hosted: Some(agents.into_iter().collect()),
            ..Self::default()
        }
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

    fn exists_as(&self, session: &SessionRef) -> bool {
        let hosted = self
            .hosted
            .as_ref()
            .is_none_or(|agents| agents.contains(&session.agent_id));
        hosted && self.exists(&session.session_key)
    }
}

/// A requester sees itself, the sessions it spawned (transitively) and the sessions that spawned
/// it (its ancestors), following `spawned_by` / `parent_session_key` in the directory, up to 32
/// levels of spawning (so that a directory whose entries name each other ends the search): a
/// session spawned 33 levels below another is not seen by it, nor sees it.
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

    /// Whether `ancestor` spawned `of`, directly or through sessions it spawned. The directory
    /// knows sessions by key alone; a key up the chain that names no agent (`global`, `main`)
    /// is taken as the session of that name of the agent below it, so the chain never reaches
    /// another agent's bare session (under `session.scope = "global"` each agent has its own
    /// `global`) unless a key on the way names that agent. The directory cannot say whose bare
    /// session spawned a child into another agent (main's `global` spawning
    /// `agent:ops:subagent:z`): such a child is placed under its own agent's bare session, so
    /// the spawner is refused what it spawned, rather than another agent's session being shown.
    fn is_ancestor(&self, ancestor: &SessionRef, of: &SessionRef) -> bool {
        let mut key = of.session_key.clone();
        let mut agent = of.agent_id.as_str().to_owned();
        for _ in 0..MAX_DEPTH {
            let Some(e) = self.directory.entry(&key) else {
                return false;
            };
            let Some(up) = e.spawned_by.or(e.parent_session_key) else {
                return false;
            };
            if let Some(named) = up.agent_id() {
                named.clone_into(&mut agent);
            }
            if up == ancestor.session_key && agent == ancestor.agent_id.as_str() {
                return true;
            }
            key = up;
        }
        false
    }
}

impl VisibilityPolicy for SpawnTree {
    /// A spawner sees what it spawned: the spawn tree is what this policy shows.
    fn can_watch_spawned(&self, _spawner: &SessionRef, _child: &SessionRef) -> bool {
        true
    }

    fn can_see(&self, requester: &SessionRef, target: &SessionRef) -> bool {
        // Itself: the same key of the same agent (another agent's `global` is not).
        if requester == target {
            return true;
        }
        // The target's agent must be the one its key names.
        let t = &target.session_key;
        if t.agent_id().is_some_and(|a| a != target.agent_id.as_str()) {
            return false;
        }
        self.is_ancestor(requester, target) || self.is_ancestor(target, requester)
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
        // Another agent's session of a key in main's tree is not in it: the rule that a
        // target's key names its own agent could be dropped without a test failing (review,
        // stop 60), and main then saw ops's `agent:main:subagent:a`.
        assert!(!p.can_see(&main, &r("agent:main:subagent:a", "ops")));
        assert!(!p.can_see(&main, &r("agent:main:subagent:a:subagent:b", "ops")));
        assert!(!p.can_see(&ops, &main));
        assert!(p.can_see(&ops, &ops));
        // Its own key of another agent is not itself.
        assert!(!p.can_see(&main, &r("agent:main:main", "ops")));
        assert!(p.can_see(&r("global", "main"), &r("global", "main")));
        assert!(!p.can_see(&r("global", "main"), &r("global", "ops")));
    }

    /// A spawn chain is followed [`MAX_DEPTH`] (32) levels up, and no further: a directory
    /// whose entries name each other as spawners (a loop) answers "not an ancestor" instead of
    /// hanging. (A depth of 10 passed every test before this one.)
    #[test]
    fn a_spawn_chain_is_followed_32_levels_and_a_loop_ends() {
        let dir = Arc::new(InMemoryDirectory::new());
        let k = |s: &str| SessionKey::new(s).unwrap();
        let level = |n: usize| format!("agent:main:subagent:s{n}");
        let spawned_by = |spawner: &str| SessionEntry {
            spawned_by: Some(k(spawner)),
            ..SessionEntry::default()
        };
        dir.upsert(k("agent:main:main"), SessionEntry::default());
        dir.upsert(k(&level(1)), spawned_by("agent:main:main"));
        for n in 2..=33 {
            dir.upsert(k(&level(n)), spawned_by(&level(n - 1)));
        }
        // Two sessions that name each other.
        dir.upsert(
            k("agent:main:subagent:p"),
            spawned_by("agent:main:subagent:q"),
        );
        dir.upsert(
            k("agent:main:subagent:q"),
            spawned_by("agent:main:subagent:p"),
        );
        let policy = SpawnTree::new(dir);
        let r = |s: &str| SessionRef::parse(s, "main").unwrap();
        let main = r("agent:main:main");
        for n in 1..=32 {
            assert!(policy.can_see(&main, &r(&level(n))), "{n} levels down");
            assert!(policy.can_see(&r(&level(n)), &main), "{n} levels up");
        }
        assert!(!policy.can_see(&main, &r(&level(33))));
        assert!(!policy.can_see(&r("agent:main:subagent:p"), &main));
        assert!(!policy.can_see(&main, &r("agent:main:subagent:q")));
    }

    /// A session whose directory entry names only its parent (no spawner) is in that parent's
    /// tree: the parent sees it, and it sees the parent. (What the mutation did: only
    /// `spawned_by` followed, a child the gateway tracks by its parent alone was hidden from
    /// the parent's `session_status`, and the child from its parent; review of stop 67, GB09.)
    #[test]
    fn a_parent_named_alone_in_the_directory_is_in_the_tree() {
        let dir = Arc::new(InMemoryDirectory::new());
        let k = |s: &str| SessionKey::new(s).unwrap();
        dir.upsert(k("agent:main:main"), SessionEntry::default());
        dir.upsert(
            k("agent:main:subagent:c"),
            SessionEntry {
                parent_session_key: Some(k("agent:main:main")),
                ..SessionEntry::default()
            },
        );
        let policy = SpawnTree::new(dir);
        let r = |s: &str| SessionRef::parse(s, "main").unwrap();
        let (main, child) = (r("agent:main:main"), r("agent:main:subagent:c"));
        assert!(policy.can_see(&main, &child), "the parent sees its child");
        assert!(policy.can_see(&child, &main), "the child sees its parent");
    }

    /// Under `session.scope = "global"` each agent has its own `global`, and a directory entry
    /// names its spawner by key alone: a child of main's `global` is in main's `global` tree,
    /// not in another agent's.
    #[test]
    fn a_bare_spawner_is_the_childs_agents_session() {
        let dir = Arc::new(InMemoryDirectory::new());
        let k = |s: &str| SessionKey::new(s).unwrap();
        let child = |spawner: &str| SessionEntry {
            spawned_by: Some(k(spawner)),
            ..SessionEntry::default()
        };
        dir.upsert(k("agent:main:subagent:x"), child("global"));
        dir.upsert(
            k("agent:main:subagent:x:subagent:y"),
            child("agent:main:subagent:x"),
        );
        // A spawn into another agent: its key names the spawner's agent.
        dir.upsert(k("agent:ops:subagent:z"), child("agent:main:subagent:x"));
        let policy = SpawnTree::new(dir);
        let r = |s: &str, a: &str| SessionRef::parse(s, a).unwrap();
        let (main_global, ops_global) = (r("global", "main"), r("global", "ops"));
        let (spawned, nested, elsewhere) = (
            r("agent:main:subagent:x", "main"),
            r("agent:main:subagent:x:subagent:y", "main"),
            r("agent:ops:subagent:z", "ops"),
        );
        for descendant in [&spawned, &nested, &elsewhere] {
            assert!(policy.can_see(&main_global, descendant), "{descendant:?}");
            assert!(policy.can_see(descendant, &main_global), "{descendant:?}");
            assert!(!policy.can_see(&ops_global, descendant), "{descendant:?}");
            assert!(!policy.can_see(descendant, &ops_global), "{descendant:?}");
        }
    }

    /// A session that spawned a child into another agent sees it, and the child sees its
    /// spawner: the spawner's key names its agent, which the chain takes before comparing.
    /// (What the mutation did: the spawner was compared with the child's agent, before the key
    /// naming main was read, and `agent:main:subagent:x` no longer saw the `agent:ops:subagent:z`
    /// it spawned; review of stop 70, GE15.)
    #[test]
    fn a_spawner_sees_a_child_it_spawned_into_another_agent() {
        let dir = Arc::new(InMemoryDirectory::new());
        let k = |s: &str| SessionKey::new(s).unwrap();
        dir.upsert(
            k("agent:ops:subagent:z"),
            SessionEntry {
                spawned_by: Some(k("agent:main:subagent:x")),
                ..SessionEntry::default()
            },
        );
        let policy = SpawnTree::new(dir);
        let r = |s: &str, a: &str| SessionRef::parse(s, a).unwrap();
        let spawner = r("agent:main:subagent:x", "main");
        let child = r("agent:ops:subagent:z", "ops");
        assert!(
            policy.can_see(&spawner, &child),
            "the spawner sees its child"
        );
        assert!(
            policy.can_see(&child, &spawner),
            "the child sees its spawner"
        );
    }

    /// `upsert` replaces a session's entry: a spawner the gateway learns later puts the session
    /// in its tree. (What the mutation did: an existing entry was kept as it was, and the
    /// spawner never saw the child; review of stop 70, GE16.)
    #[test]
    fn upsert_replaces_an_entry() {
        let dir = Arc::new(InMemoryDirectory::new());
        let k = |s: &str| SessionKey::new(s).unwrap();
        dir.upsert(k("agent:main:subagent:c"), SessionEntry::default());
        dir.upsert(
            k("agent:main:subagent:c"),
            SessionEntry {
                spawned_by: Some(k("agent:main:main")),
                ..SessionEntry::default()
            },
        );
        assert_eq!(
            dir.entry(&k("agent:main:subagent:c"))
                .and_then(|e| e.spawned_by),
            Some(k("agent:main:main")),
            "the new entry replaced the old"
        );
    }

    /// A directory of a gateway that hosts some agents answers `exists_as` by the agent the
    /// session's ref names, also where its key names another: another agent's session of a key
    /// naming a hosted agent is not the gateway's, and a hosted agent's session of a key naming
    /// another agent is. (What the mutation did: the agent read from the key, a gateway took
    /// another gateway's session for its own and left one of its own unchecked; review of stop
    /// 68, GD16.)
    #[test]
    fn a_hosting_directory_answers_by_the_refs_agent() {
        let k = |s: &str| SessionKey::new(s).unwrap();
        let dir = InMemoryDirectory::hosting([AgentId::new("main").unwrap()]);
        dir.upsert(k("agent:main:subagent:c"), SessionEntry::default());
        dir.upsert(k("agent:ops:subagent:d"), SessionEntry::default());
        let r = |s: &str, a: &str| SessionRef::parse(s, a).unwrap();
        assert!(dir.exists_as(&r("agent:main:subagent:c", "main")));
        assert!(
            !dir.exists_as(&r("agent:main:subagent:c", "ops")),
            "ops's session is not this gateway's"
        );
        assert!(
            dir.exists_as(&r("agent:ops:subagent:d", "main")),
            "main's session is this gateway's"
        );
    }
}
