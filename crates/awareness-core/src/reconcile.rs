//! The reconcile page of DESIGN.md section 5 (`session_status` with `changesSince`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::{Event, Head, Sequence};

/// Largest page (and the default limit).
pub const MAX_PAGE_LIMIT: usize = 200;

/// Clamps a requested limit into `1..=200`; no limit means 200.
pub fn clamp_limit(limit: Option<usize>) -> usize {
    limit.unwrap_or(MAX_PAGE_LIMIT).clamp(1, MAX_PAGE_LIMIT)
}

/// The events after a caller's version, with what the caller needs to trust them as a delta.
/// Built by the stores; fields may be added (as `versionAhead` was), so it is not built outside
/// this crate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ChangesPage {
    /// Events with `sequence > N` of exactly this ref, ascending (shared, not copied).
    pub events: Vec<Arc<Event>>,
    /// More events exist after the last one returned.
    pub truncated: bool,
    /// Smallest retained sequence of the ref (`head + 1` when none is retained and the head is
    /// above 0, else 0).
    pub earliest_available_sequence: Sequence,
    /// `N` is below the ref's pruned watermark: events the caller has not seen were pruned.
    pub history_gap: bool,
    /// `N` is above `stateVersion`: the caller's version belongs to another incarnation or agent,
    /// so the page is no delta. Only serialized when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub version_ahead: bool,
}

/// `session_status`: always the version, the page when `changesSince` was asked. Fields may
/// be added (as `unavailable` was), so outside this crate it is built only by
/// [`crate::AwarenessStoreExt::session_status`], [`status`] (for a store that reads the version
/// and the page itself), [`SessionStatus::unavailable`] and deserializing its JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct SessionStatus {
    /// The head (0 when nothing was recorded).
    pub state_version: Sequence,
    /// The page, when `changesSince` was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_changes: Option<ChangesPage>,
    /// The store could not be read: the other fields are placeholders (version 0, an empty
    /// page that claims nothing), not the session's state. Ours, like `versionAhead`: only
    /// serialized when true, so every answer read from a store is byte-compatible with
    /// OpenClaw's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unavailable: bool,
}

impl SessionStatus {
    /// The answer when the store could not be read: marked `unavailable`, version 0
    /// and, when `changes_since` was asked, an empty page with no gap and no `versionAhead`
    /// (which would tell the caller its version is from another incarnation, a claim nothing
    /// was read to support).
    pub fn unavailable(changes_since: Option<Sequence>) -> Self {
        Self {
            state_version: Sequence::ZERO,
            state_changes: changes_since.map(|_| ChangesPage {
                events: Vec::new(),
                truncated: false,
                earliest_available_sequence: Sequence::ZERO,
                history_gap: false,
                version_ahead: false,
            }),
            unavailable: true,
        }
    }
}

/// The `session_status` answer from its two reads: the version read first, then, when
/// `changesSince` was asked, the page after it (`(after, page)`). A recording may land between
/// the reads, so the version is raised to the page's last event (it never names an event
/// recorded after the page was read) and, when the page found `after` within the head it read
/// (not `versionAhead`), to `after` too: `versionAhead` is then set exactly when `after` is above
/// the version answered. When the page found its head below `after` (`versionAhead`), the
/// version is kept below `after` as well: a version above it was read before the session
/// shrank (a delete between the reads), and would contradict the page. A page that found no
/// session at all (no event, `earliestAvailableSequence` 0: no head) makes the version 0, from
/// any `after`: heads only ever go away with their session, so a version read first was read
/// before a delete.
pub fn status(state_version: Sequence, page: Option<(Sequence, ChangesPage)>) -> SessionStatus {
    let mut state_version = state_version;
    if let Some((after, page)) = &page {
        if page.events.is_empty() && page.earliest_available_sequence == Sequence::ZERO {
            state_version = Sequence::ZERO;
        }
        if let Some(last) = page.events.last() {
            state_version = state_version.max(last.sequence);
        }
        if page.version_ahead {
            // `after` is above the page's head, so at least 1.
            state_version = state_version.min(Sequence(after.get().saturating_sub(1)));
        } else {
            state_version = state_version.max(*after);
        }
    }
    SessionStatus {
        state_version,
        state_changes: page.map(|(_, page)| page),
        unavailable: false,
    }
}

/// The `earliestAvailableSequence` rule.
pub fn earliest_available(min_retained: Option<Sequence>, head: Sequence) -> Sequence {
    match min_retained {
        Some(s) => s,
        None if head > Sequence::ZERO => head.next(),
        None => Sequence::ZERO,
    }
}

/// Assembles a page from what a backend read.
///
/// `fetched` holds up to `limit + 1` events with `sequence > after`, ascending; the extra one
/// only says that the page is truncated. `min_retained` is the ref's smallest retained sequence.
pub fn build_page(
    after: Sequence,
    head: Option<&Head>,
    min_retained: Option<Sequence>,
    mut fetched: Vec<Arc<Event>>,
    limit: usize,
) -> ChangesPage {
    let (last, pruned) = head.map_or((Sequence::ZERO, Sequence::ZERO), |h| {
        (h.last_sequence, h.pruned_max_sequence)
    });
    let truncated = fetched.len() > limit;
    fetched.truncate(limit);
    ChangesPage {
        events: fetched,
        truncated,
        earliest_available_sequence: earliest_available(min_retained, last),
        history_gap: after < pruned,
        version_ahead: after > last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{SessionRef, Timestamp};

    fn head(last: u64, pruned: u64) -> Head {
        Head {
            session: SessionRef::parse("s", "main").unwrap(),
            last_sequence: Sequence(last),
            pruned_max_sequence: Sequence(pruned),
            updated_at: Timestamp(0),
        }
    }

    #[test]
    fn limits() {
        assert_eq!(clamp_limit(None), 200);
        assert_eq!(clamp_limit(Some(0)), 1);
        assert_eq!(clamp_limit(Some(5)), 5);
        assert_eq!(clamp_limit(Some(10_000)), 200);
    }

    /// A version read before the session was deleted (10), beside a page that found no head:
    /// the answer is the deleted session's version, 0, whatever `N` (`versionAhead` for 5, not
    /// for 0). Beside a page that found the session grown again to 3 (pruned), it does not
    /// claim a version at or above `N`.
    #[test]
    fn a_version_from_before_a_delete_is_kept_below_a_version_ahead_n() {
        for after in [5, 0] {
            let page = build_page(Sequence(after), None, None, Vec::new(), 200);
            assert_eq!(page.version_ahead, after > 0);
            let s = status(Sequence(10), Some((Sequence(after), page)));
            assert_eq!(s.state_version, Sequence::ZERO, "N = {after}");
            assert_eq!(s.state_changes.expect("page").version_ahead, after > 0);
        }
        let page = build_page(Sequence(5), Some(&head(3, 3)), None, Vec::new(), 200);
        assert!(page.version_ahead);
        let s = status(Sequence(10), Some((Sequence(5), page)));
        assert_eq!(s.state_version, Sequence(4), "below N");
        let page = build_page(Sequence(5), Some(&head(3, 0)), None, Vec::new(), 200);
        assert_eq!(
            status(Sequence(3), Some((Sequence(5), page))).state_version,
            Sequence(3),
            "a version already below N stays"
        );
    }
    /// A truncated page beside a version read before it: the answer keeps the version (10), above
    /// the page's last event (3), so the caller knows the session is past the page. (What the
    /// mutation did: the version set to the page's last event instead of raised to it, a
    /// truncated page's answer claimed version 3 for a session at 10; review of stop 68, CP05.)
    #[test]
    fn a_truncated_page_keeps_the_version_read_before_it() {
        let session = SessionRef::parse("s", "main").unwrap();
        let fetched: Vec<Arc<Event>> = (1..=4)
            .map(|seq| crate::model::test_message(&session, seq))
            .collect();
        let page = build_page(Sequence(0), Some(&head(10, 0)), None, fetched, 3);
        assert!(page.truncated);
        let s = status(Sequence(10), Some((Sequence(0), page)));
        assert_eq!(
            s.state_version,
            Sequence(10),
            "the version read, not the page's last event"
        );
    }

    #[test]
    fn earliest_rules() {
        assert_eq!(
            earliest_available(Some(Sequence(3)), Sequence(10)),
            Sequence(3)
        );
        assert_eq!(earliest_available(None, Sequence(1)), Sequence(2));
        assert_eq!(earliest_available(None, Sequence(0)), Sequence(0));
    }

    #[test]
    fn gap_and_ahead_flags() {
        let h = head(10, 4);
        let p = build_page(Sequence(3), Some(&h), Some(Sequence(5)), vec![], 200);
        assert!(p.history_gap && !p.version_ahead);
        let p = build_page(Sequence(4), Some(&h), Some(Sequence(5)), vec![], 200);
        assert!(!p.history_gap);
        let p = build_page(Sequence(11), Some(&h), Some(Sequence(5)), vec![], 200);
        assert!(p.version_ahead);
        let json =
            serde_json::to_string(&build_page(Sequence(0), None, None, vec![], 200)).unwrap();
        assert_eq!(
            json,
            r#"{"events":[],"truncated":false,"earliestAvailableSequence":0,"historyGap":false}"#
        );
        let json = serde_json::to_string(&p).unwrap();
        assert!(
            json.ends_with(r#""historyGap":false,"versionAhead":true}"#),
            "{json}"
        );
    }

    /// A `session_status` answer read from a store serializes as OpenClaw's does: no `unavailable`
    /// key unless it is true, and no `stateChanges` unless `changesSince` was asked. (What the
    /// mutation did: the skip rule taken off `unavailable`, every answer, `awareness status --json`
    /// included, carried `"unavailable":false`, a key of ours that OpenClaw's answers do not have;
    /// review of stop 63, K16.) The answer when the store could not be read: version 0,
    /// `unavailable`, and when `changesSince` was asked an empty page that claims nothing (no
    /// history gap). (What the mutations did: the page left out, or claiming a history gap; the
    /// gateway's tests compare its answer with `SessionStatus::unavailable` itself; review of
    /// stop 65, CO35 and CO36.)
    #[test]
    fn a_status_read_from_a_store_has_openclaws_json_shape() {
        let json = |s: &SessionStatus| serde_json::to_value(s).unwrap();
        let version_only = status(Sequence(4), None);
        assert_eq!(json(&version_only), serde_json::json!({"stateVersion": 4}));
        let page = build_page(Sequence(4), Some(&head(4, 0)), None, Vec::new(), 200);
        assert_eq!(
            json(&status(Sequence(4), Some((Sequence(4), page)))),
            serde_json::json!({"stateVersion": 4, "stateChanges": {
                "events": [], "truncated": false, "earliestAvailableSequence": 5,
                "historyGap": false}})
        );
        assert_eq!(
            json(&SessionStatus::unavailable(None)),
            serde_json::json!({"stateVersion": 0, "unavailable": true})
        );
        assert_eq!(
            json(&SessionStatus::unavailable(Some(Sequence(7)))),
            serde_json::json!({"stateVersion": 0, "stateChanges": {
                "events": [], "truncated": false, "earliestAvailableSequence": 0,
                "historyGap": false}, "unavailable": true})
        );
    }
}
