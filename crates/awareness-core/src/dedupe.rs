//! The dedupe keys DESIGN.md section 3 gives the events of each producer, so that a producer
//! retried (a gateway replaying a hook, a restart) records its event once, on every backend
//! and in every adapter. A key built from an id is `None` when the id is empty: `compacted:`
//! alone would merge unrelated events into the first one recorded.
//!
//! Human turns and upstream checks have theirs in [`crate::upstream`].

use crate::model::{SessionKey, SessionRef};

fn of(prefix: &str, id: &str) -> Option<String> {
    (!id.is_empty()).then(|| format!("{prefix}{id}"))
}

/// `child-spawned:<runId>`, of a `child_spawned` event.
pub fn child_spawned(run_id: &str) -> Option<String> {
    of("child-spawned:", run_id)
}

/// `run-terminal:<runId>`, of a `run_completed` or `run_failed` event (one per run, whatever
/// its outcome).
pub fn run_terminal(run_id: &str) -> Option<String> {
    of("run-terminal:", run_id)
}

/// `compacted:<operationId>`, of a `compacted` event.
pub fn compacted(operation_id: &str) -> Option<String> {
    of("compacted:", operation_id)
}

/// `adopted:<sessionKey>`, of an `adopted` event.
pub fn adopted(session: &SessionKey) -> String {
    format!("adopted:{session}")
}

/// `created:<agentId>:<sessionKey>:<sessionId>`, of a `created` event.
pub fn created(session: &SessionRef, session_id: &str) -> Option<String> {
    (!session_id.is_empty()).then(|| {
        format!(
            "created:{}:{}:{session_id}",
            session.agent_id, session.session_key
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_of_design_section_3() {
        let r = SessionRef::parse("agent:main:subagent:c", "main").unwrap();
        assert_eq!(
            child_spawned("run-1").as_deref(),
            Some("child-spawned:run-1")
        );
        assert_eq!(run_terminal("run-1").as_deref(), Some("run-terminal:run-1"));
        assert_eq!(compacted("op-1").as_deref(), Some("compacted:op-1"));
        assert_eq!(adopted(&r.session_key), "adopted:agent:main:subagent:c");
        assert_eq!(
            created(&r, "s-1").as_deref(),
            Some("created:main:agent:main:subagent:c:s-1")
        );
        for empty in [
            child_spawned(""),
            run_terminal(""),
            compacted(""),
            created(&r, ""),
        ] {
            assert_eq!(empty, None, "an empty id gives no key");
        }
    }
}
