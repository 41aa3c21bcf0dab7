//! The ports a gateway implements, so the adapter can deliver notices and ask questions.
//!
//! They are synchronous on purpose: each is a quick in-memory operation in a gateway (a queue
//! push, a wake request, a directory lookup, a policy decision). Ready implementations live in
//! [`crate::queue`], [`crate::wake`] and [`crate::directory`].

use awareness_core::{SessionKey, SessionRef};

/// One line in a session's system-event queue.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueuedEntry {
    /// The text the session's model reads.
    pub text: String,
    /// What the entry is about; session-state notices use `session-state:<hex>`.
    pub context_key: Option<String>,
}

impl QueuedEntry {
    /// Whether this entry is a session-state notice (by its context key's prefix).
    pub fn is_session_state(&self) -> bool {
        self.context_key
            .as_deref()
            .is_some_and(awareness_core::protocol::is_session_state_context_key)
    }
}

/// The gateway's per-session queue of system events, read by the session's next turn.
pub trait SystemEventQueue: Send + Sync {
    /// Appends an entry unless one with the same text and context key is already queued;
    /// returns whether it was added. A session-state notice must never be evicted silently.
    fn enqueue(&self, session: &SessionKey, entry: QueuedEntry) -> bool;
    /// Removes and returns everything queued for the session, oldest first.
    fn drain(&self, session: &SessionKey) -> Vec<QueuedEntry>;
    /// Returns what is queued without removing it.
    fn peek(&self, session: &SessionKey) -> Vec<QueuedEntry>;
    /// Removes the queued entry equal to `entry` (same text and context key; the queue holds at
    /// most one), keeping the others in order; returns whether one was there.
    ///
    /// [`crate::Awareness::drain_turn`] calls it after acknowledging, to drop a copy of a notice
    /// the turn has just read that was queued again while the acknowledgement was in flight.
    /// The default removes nothing and answers `false`, for queues written before this method:
    /// such a copy then stays queued until the next turn, which drains it as a stale line: it
    /// acknowledges nothing and is left out of what the turn reads.
    fn remove(&self, session: &SessionKey, entry: &QueuedEntry) -> bool {
        let _ = (session, entry);
        false
    }
}

/// Wakes a session now (the gateway's heartbeat wake), so it takes a turn.
pub trait HeartbeatWake: Send + Sync {
    /// Requests a wake; implementations may coalesce.
    fn wake(&self, session: &SessionKey, reason: &str);
}

/// What the gateway's session directory knows about a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionEntry {
    /// The session that spawned this one.
    pub spawned_by: Option<SessionKey>,
    /// The parent session, when the gateway tracks one apart from the spawner.
    pub parent_session_key: Option<SessionKey>,
    /// The session id (incarnation).
    pub session_id: Option<String>,
}

/// The gateway's session directory.
pub trait SessionDirectory: Send + Sync {
    /// Whether the session exists, and so is this gateway's: the sweep re-notifies, and a
    /// pick-up queues, only watchers that exist; with
    /// [`AwarenessConfig::owned_watchers_only`](crate::AwarenessConfig::owned_watchers_only),
    /// deliveries go only to them, and the upstream monitor checks only the adopted sessions
    /// that exist.
    fn exists(&self, session: &SessionKey) -> bool;
    /// The session's entry, when it exists.
    fn entry(&self, session: &SessionKey) -> Option<SessionEntry>;
    /// Whether `session`, a key with its agent, exists, and so is this gateway's: what the
    /// upstream monitor asks, with
    /// [`AwarenessConfig::owned_watchers_only`](crate::AwarenessConfig::owned_watchers_only),
    /// of an adopted session. Under `session.scope = "global"` every agent has a session
    /// called `global`, so the key alone cannot tell this gateway's from another gateway's
    /// agent's: a directory of a gateway that hosts some agents and not others answers by the
    /// agent too ([`InMemoryDirectory::hosting`](crate::InMemoryDirectory::hosting)). The
    /// default answers by the key alone ([`SessionDirectory::exists`]), which is right for an
    /// agent-qualified key and for a gateway that hosts every agent.
    fn exists_as(&self, session: &SessionRef) -> bool {
        self.exists(&session.session_key)
    }
}

/// May `requester` see `target`? The gateway decides (its own sessions, its spawn tree, its
/// agent's, all).
///
/// Both come as refs, because under `session.scope = "global"` every agent has its own session
/// called `global`: the key alone cannot tell a requester's own session from another agent's
/// of the same name. [`Awareness`](crate::Awareness) gives the requester the agent the gateway
/// names (`session_status_as`, `state_versions_as`), else the agent its key names, else for a
/// bare key the default agent ([`AwarenessConfig::default_agent`](crate::AwarenessConfig)).
pub trait VisibilityPolicy: Send + Sync {
    /// Whether the requester may read, list or watch the target.
    fn can_see(&self, requester: &SessionRef, target: &SessionRef) -> bool;

    /// Whether the gateway may make `spawner` a watcher of `child` because it spawned it or is
    /// its parent: the spawner's cursor a `child_spawned` seeds, and the spawner or parent a
    /// session's entry names, which its turns notify. The relationship may not be in the
    /// directory yet (the spawn is reported first, or the caller passes the entry). The
    /// default asks [`VisibilityPolicy::can_see`].
    fn can_watch_spawned(&self, spawner: &SessionRef, child: &SessionRef) -> bool {
        self.can_see(spawner, child)
    }
}

/// A policy that lets everyone see everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl VisibilityPolicy for AllowAll {
    fn can_see(&self, _: &SessionRef, _: &SessionRef) -> bool {
        true
    }
}

/// A policy that lets a requester see only sessions of its own agent: an agent-qualified
/// requester's agent is the one its key names; a bare requester's (`global`, under
/// `session.scope = "global"`) is the agent its ref names: the one the gateway names through
/// the `_as` methods ([`Awareness::session_status_as`](crate::Awareness::session_status_as),
/// ...), else the default agent ([`AwarenessConfig::default_agent`](crate::AwarenessConfig)).
/// So each agent's `global` session, named through the `_as` methods, sees that agent's
/// sessions, its subagents among them, and not another agent's `global`; through the key-only
/// methods every `global` is the default agent's, and sees the default agent's sessions (a
/// gateway with several agents under global scope calls the `_as` methods).
#[derive(Debug, Clone, Copy, Default)]
pub struct SameAgent;

impl VisibilityPolicy for SameAgent {
    fn can_see(&self, requester: &SessionRef, target: &SessionRef) -> bool {
        let agent = requester
            .session_key
            .agent_id()
            .unwrap_or(requester.agent_id.as_str());
        agent == target.agent_id.as_str()
    }
}

/// Where an input to a session came from, as the gateway knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputProvenance {
    /// Another session sent it (`sessions_send`).
    InterSession {
        /// The sending session.
        source: SessionKey,
    },
    /// The gateway itself (a system event, a heartbeat, a cron).
    Internal,
    /// A channel message from a person.
    Channel {
        /// The person's id on the channel, when known.
        sender_id: Option<String>,
    },
}

/// Classifies an input at the gateway boundary (DESIGN.md section 3): inter-session input is an
/// `agent` (actor id = the source session), internal input is `system`, anything else, including
/// missing provenance, is `human`. [`crate::Awareness::human_message`] records only `human`
/// input.
pub fn classify_actor(
    provenance: Option<&InputProvenance>,
) -> (awareness_core::ActorType, Option<String>) {
    use awareness_core::ActorType;
    match provenance {
        Some(InputProvenance::InterSession { source }) => {
            (ActorType::Agent, Some(source.as_str().to_owned()))
        }
        Some(InputProvenance::Internal) => (ActorType::System, None),
        Some(InputProvenance::Channel { sender_id }) => (ActorType::Human, sender_id.clone()),
        None => (ActorType::Human, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use awareness_core::ActorType;

    #[test]
    fn actor_classification() {
        let src = SessionKey::new("agent:main:main").unwrap();
        assert_eq!(
            classify_actor(Some(&InputProvenance::InterSession { source: src })),
            (ActorType::Agent, Some("agent:main:main".into()))
        );
        assert_eq!(
            classify_actor(Some(&InputProvenance::Internal)),
            (ActorType::System, None)
        );
        assert_eq!(classify_actor(None), (ActorType::Human, None));
        assert_eq!(
            classify_actor(Some(&InputProvenance::Channel {
                sender_id: Some("u".into())
            })),
            (ActorType::Human, Some("u".into()))
        );
    }

    #[test]
    fn same_agent_policy() {
        let r = |key: &str, agent: &str| SessionRef::parse(key, agent).unwrap();
        let ops = r("agent:ops:main", "ops");
        let main_child = r("agent:main:subagent:c", "main");
        let ops_child = r("agent:ops:subagent:c", "ops");
        assert!(!SameAgent.can_see(&ops, &main_child));
        assert!(SameAgent.can_see(&ops, &ops_child));
        assert!(AllowAll.can_see(&ops, &main_child));
        // Under global scope each agent has its own `global`: a bare requester sees its own,
        // and its own agent's subagents, by the agent its ref names.
        let global = r("global", "main");
        assert!(SameAgent.can_see(&global, &r("global", "main")));
        assert!(!SameAgent.can_see(&global, &r("global", "ops")));
        assert!(SameAgent.can_see(&global, &main_child));
        assert!(!SameAgent.can_see(&global, &ops_child));
        let ops_global = r("global", "ops");
        assert!(SameAgent.can_see(&ops_global, &ops_child));
        assert!(!SameAgent.can_see(&ops_global, &main_child));
        // An agent-qualified key names its agent, whatever the ref says.
        assert!(!SameAgent.can_see(&r("agent:ops:main", "main"), &main_child));
    }

    /// `SameAgent` answers by the target's agent, the one its ref names, even where its key names
    /// another (another agent's session of the same key, which a deletion under one agent leaves
    /// to the other): the key's agent does not let its namesake see it. (What the mutation did:
    /// the target's agent read from its key, and main saw ops's session `agent:main:subagent:c`
    /// while ops, its owner, did not; review of stop 67, GB31.)
    #[test]
    fn same_agent_goes_by_the_targets_own_agent() {
        let r = |key: &str, agent: &str| SessionRef::parse(key, agent).unwrap();
        let ops_owned = r("agent:main:subagent:c", "ops");
        assert!(
            !SameAgent.can_see(&r("agent:main:main", "main"), &ops_owned),
            "main does not see ops's session"
        );
        assert!(
            SameAgent.can_see(&r("agent:ops:main", "ops"), &ops_owned),
            "ops sees its own session"
        );
    }

    /// The ports' default methods ask what they stand for: `can_watch_spawned` asks the policy
    /// (under `SameAgent`, a spawner does not watch a child in another agent), and `exists_as` asks
    /// the directory by the key. (What the mutations did: either default `true`, a manager spawning
    /// into another agent learned its child's changes, which the policy hides, and a directory
    /// without an `exists_as` of its own answered every session as existing, so that under
    /// `owned_watchers_only` the monitor checked other gateways' adopted sessions; review of stop
    /// 63, W39 and W40.)
    #[test]
    fn the_defaults_ask_the_policy_and_the_key() {
        /// A directory that knows one session, by its key, and has no `exists_as` of its own.
        struct Only(SessionKey);
        impl SessionDirectory for Only {
            fn exists(&self, session: &SessionKey) -> bool {
                *session == self.0
            }
            fn entry(&self, _: &SessionKey) -> Option<SessionEntry> {
                None
            }
        }
        let r = |key: &str, agent: &str| SessionRef::parse(key, agent).unwrap();
        let main = r("agent:main:main", "main");
        assert!(SameAgent.can_watch_spawned(&main, &r("agent:main:subagent:c", "main")));
        assert!(
            !SameAgent.can_watch_spawned(&main, &r("agent:ops:subagent:c", "ops")),
            "a child in another agent is not watched under SameAgent"
        );
        let dir = Only(SessionKey::new("agent:main:main").unwrap());
        assert!(dir.exists_as(&main));
        assert!(
            !dir.exists_as(&r("agent:main:other", "main")),
            "a session the directory does not know does not exist"
        );
    }

    /// The default `can_watch_spawned` asks whether the spawner may see the child, not the
    /// reverse: under a gateway's one-way policy (a manager sees its workers, a worker does not
    /// see its manager) the manager watches what it spawned. (What the mutation did: the two
    /// turned round, the child was asked whether it may see its spawner, and a manager under
    /// such a policy was never told of its workers' changes; review of stop 71, GF32.)
    #[test]
    fn the_default_asks_whether_the_spawner_sees_the_child() {
        /// Only the manager sees anything.
        struct ManagerSees;
        impl VisibilityPolicy for ManagerSees {
            fn can_see(&self, requester: &SessionRef, _: &SessionRef) -> bool {
                requester.session_key.as_str() == "agent:main:main"
            }
        }
        let r = |key: &str| SessionRef::parse(key, "main").unwrap();
        let (manager, worker) = (r("agent:main:main"), r("agent:main:subagent:w"));
        assert!(
            ManagerSees.can_watch_spawned(&manager, &worker),
            "the manager watches the worker it spawned"
        );
        assert!(
            !ManagerSees.can_watch_spawned(&worker, &manager),
            "a worker does not watch its manager"
        );
    }

    /// A queue that does not implement `remove` removes nothing and says so. (What the mutation
    /// did: the default answered `true`, a removal that did not happen; review of stop 65, GA43.)
    #[test]
    fn the_default_remove_removes_nothing_and_says_so() {
        struct Fixed;
        impl SystemEventQueue for Fixed {
            fn enqueue(&self, _: &SessionKey, _: QueuedEntry) -> bool {
                true
            }
            fn drain(&self, _: &SessionKey) -> Vec<QueuedEntry> {
                Vec::new()
            }
            fn peek(&self, _: &SessionKey) -> Vec<QueuedEntry> {
                Vec::new()
            }
        }
        let entry = QueuedEntry {
            text: "line".into(),
            context_key: None,
        };
        let session = SessionKey::new("agent:main:main").unwrap();
        assert!(
            !Fixed.remove(&session, &entry),
            "the default removes nothing and answers false"
        );
    }
}
