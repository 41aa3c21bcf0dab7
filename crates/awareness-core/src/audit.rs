//! The invariants a store's rows must keep, checked over what it holds: every retained event
//! has a head at or above it, a head's pruned watermark never passes its version, every cursor
//! is well formed and never points past its target's head, and a cursor that has seen an event
//! has a target with a head. [`audit`] is pure; [`audit_store`] reads a store, live or not, and
//! is what an operator's tool (`awareness doctor`) runs.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use crate::error::StoreError;
use crate::model::{Cursor, CursorFilter, Event, Head, Sequence, SessionKey, SessionRef};
use crate::store::{AwarenessStore, UnreadableCursor};

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finding {
    /// Retained events of a session that has no head.
    EventsWithoutHead {
        /// The session.
        session: SessionRef,
        /// Its highest retained event.
        max: Sequence,
    },
    /// A head below an event of its session.
    HeadBehindEvent {
        /// The session.
        session: SessionRef,
        /// The head's version.
        head: Sequence,
        /// The session's highest retained event.
        event: Sequence,
    },
    /// A head whose pruned watermark is above its version.
    WatermarkAboveVersion {
        /// The session.
        session: SessionRef,
        /// The watermark.
        watermark: Sequence,
        /// The version.
        version: Sequence,
    },
    /// A cursor whose sequences are out of order (`last_seen <= notified <= material` broken).
    TornCursor(Cursor),
    /// A cursor whose `material` is past its target's head. A cursor on a bare target key (no
    /// agent in it, as OpenClaw writes them) is held to the highest head of any agent's
    /// session of that key, which OpenClaw's recordings move it for (docs/decisions/0001).
    CursorPastHead {
        /// The cursor.
        cursor: Cursor,
        /// The target's head (on a bare key, the highest of its agents' sessions').
        head: Sequence,
    },
    /// A cursor that has seen an event of a target that has no head (on a bare key: no agent's
    /// session of that key has one).
    OrphanedCursor(Cursor),
    /// A cursor row the store holds but cannot read, which every other read leaves out
    /// ([`crate::CursorStore::unreadable_cursors`]).
    UnreadableCursor(UnreadableCursor),
    /// A head row the store holds but cannot read, which listings leave out
    /// (docs/decisions/0020), found through its session's retained events or a cursor that
    /// has seen an event of it.
    UnreadableHead {
        /// The session.
        session: SessionRef,
        /// Why it cannot be read.
        reason: String,
    },
    /// The log cannot be read past `after`: the row after it cannot be read (the store's error,
    /// in `reason`, names it), and the events past it were not audited.
    UnreadableEvent {
        /// The last event read before the row that cannot be (0 when it is the first).
        after: Sequence,
        /// Why it cannot be read.
        reason: String,
    },
}

fn name(c: &Cursor) -> String {
    format!("cursor {} -> {} ({})", c.watcher, c.target, c.target_agent)
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EventsWithoutHead { session, max } => {
                write!(f, "events of {session} up to {max} have no head")
            }
            Self::HeadBehindEvent {
                session,
                head,
                event,
            } => write!(f, "head of {session} is {head} but an event {event} exists"),
            Self::WatermarkAboveVersion {
                session,
                watermark,
                version,
            } => write!(
                f,
                "head of {session} has pruned watermark {watermark} above its version {version}"
            ),
            Self::TornCursor(c) => write!(
                f,
                "{} is torn: last_seen {} notified {} material {}",
                name(c),
                c.last_seen,
                c.notified,
                c.material
            ),
            Self::CursorPastHead { cursor, head } => write!(
                f,
                "{} points past the target's head {head} (material {})",
                name(cursor),
                cursor.material
            ),
            Self::OrphanedCursor(c) => write!(f, "{} is orphaned: its target has no head", name(c)),
            Self::UnreadableCursor(u) => u.fmt(f),
            Self::UnreadableHead { session, reason } => {
                write!(f, "head of {session} cannot be read: {reason}")
            }
            Self::UnreadableEvent { after, reason } => write!(
                f,
                "the log cannot be read past event {after} (the events after it were not \
                 audited): {reason}"
            ),
        }
    }
}

/// Every broken invariant among `heads`, `events` (the retained ones) and `cursors`: events
/// first (in session order), then heads, then cursors, both in the order given.
///
/// The three may be read in separate snapshots of a live store. Heads only grow, so reading
/// them last leaves no false [`Finding::HeadBehindEvent`] or [`Finding::CursorPastHead`]; a
/// session deleted between the reads can still show as [`Finding::EventsWithoutHead`] or
/// [`Finding::OrphanedCursor`], which the caller should read again before reporting.
pub fn audit(heads: &[Head], events: &[Arc<Event>], cursors: &[Cursor]) -> Vec<Finding> {
    let by_ref: HashMap<&SessionRef, &Head> = heads.iter().map(|h| (&h.session, h)).collect();
    let mut max_seen: BTreeMap<SessionRef, Sequence> = BTreeMap::new();
    for e in events {
        let max = max_seen.entry(e.session_ref()).or_insert(e.sequence);
        *max = (*max).max(e.sequence);
    }
    let mut found = Vec::new();
    for (session, max) in max_seen {
        match by_ref.get(&session) {
            None => found.push(Finding::EventsWithoutHead { session, max }),
            Some(h) if h.last_sequence < max => found.push(Finding::HeadBehindEvent {
                head: h.last_sequence,
                session,
                event: max,
            }),
            Some(_) => {}
        }
    }
    for h in heads {
        if h.pruned_max_sequence > h.last_sequence {
            found.push(Finding::WatermarkAboveVersion {
                session: h.session.clone(),
                watermark: h.pruned_max_sequence,
                version: h.last_sequence,
            });
        }
    }
    // The highest head of each key over its agents' sessions, for cursors on a bare key.
    let mut by_key: HashMap<&SessionKey, Sequence> = HashMap::new();
    for h in heads {
        let max = by_key.entry(&h.session.session_key).or_default();
        *max = (*max).max(h.last_sequence);
    }
    for c in cursors {
        if !c.is_well_formed() {
            found.push(Finding::TornCursor(c.clone()));
        }
        // A cursor on a bare key (no agent in it) is held to the highest head of any agent's
        // session of that key: OpenClaw seeds one from the default agent's head and moves it
        // for every agent's recordings on the key (decision 0001), and such a row, read with
        // the watcher's agent, was reported past its head or orphaned in a file OpenClaw
        // kept whole (review, stop 58).
        let head = if c.target.agent_id().is_none() {
            by_key.get(&c.target).copied()
        } else {
            by_ref.get(&c.target_ref()).map(|h| h.last_sequence)
        };
        match head {
            Some(head) if c.material > head => found.push(Finding::CursorPastHead {
                cursor: c.clone(),
                head,
            }),
            None if c.material > Sequence::ZERO => found.push(Finding::OrphanedCursor(c.clone())),
            _ => {}
        }
    }
    found
}

/// What [`audit_store`] found, and how much it read.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreAudit {
    /// The broken invariants, in [`audit`]'s order.
    pub findings: Vec<Finding>,
    /// The heads read.
    pub heads: usize,
    /// The cursors read.
    pub cursors: usize,
}

/// Audits a store that may be live (a gateway recording meanwhile): reads the cursors, then
/// the retained events, then the heads (which only grow, so they cover what was read before
/// them), and runs [`audit`], then adds the cursor rows the store cannot read
/// ([`Finding::UnreadableCursor`]). A finding that a deletion between the reads could fake
/// ([`Finding::EventsWithoutHead`], [`Finding::OrphanedCursor`]) is kept only if [`audit`]
/// still finds it in a fresh read of that session or cursor; events whose head the listing
/// left out because it cannot be read are reported as [`Finding::UnreadableHead`]. An event row
/// the store cannot read ([`StoreError::Corrupt`]) ends the reading of the log there, reported
/// as [`Finding::UnreadableEvent`] after the events before it are audited; the heads and
/// cursors are audited still. The findings come in that order: [`audit`]'s (those a fresh read
/// keeps), then the unreadable event row, then the unreadable cursor rows.
pub async fn audit_store(store: &dyn AwarenessStore) -> Result<StoreAudit, StoreError> {
    let cursors = store.cursors(&CursorFilter::default()).await?;
    let mut events = Vec::new();
    let unreadable_log = read_log(store, 5_000, |page| events.extend(page))
        .await?
        .map(|row| Finding::UnreadableEvent {
            after: row.after,
            reason: crate::error::ErrorChain(&row.error).to_string(),
        });
    let heads = store.list_heads(None).await?;
    let mut findings = Vec::new();
    let mut unreadable = std::collections::HashSet::new();
    for finding in audit(&heads, &events, &cursors) {
        // An unreadable head is found through its events and each cursor on it: named once.
        if let Some(finding) = still_found(store, finding).await?
            && match &finding {
                Finding::UnreadableHead { session, .. } => unreadable.insert(session.clone()),
                _ => true,
            }
        {
            findings.push(finding);
        }
    }
    findings.extend(unreadable_log);
    findings.extend(
        store
            .unreadable_cursors()
            .await?
            .into_iter()
            .map(Finding::UnreadableCursor),
    );
    Ok(StoreAudit {
        findings,
        heads: heads.len(),
        cursors: cursors.len(),
    })
}

/// Where [`read_log`] stopped: at an event row the store cannot read.
#[derive(Debug)]
pub struct UnreadableRow {
    /// The last event read before it ([`Sequence::ZERO`] when it is the log's first).
    pub after: Sequence,
    /// The store's error ([`StoreError::Corrupt`]), which names the row.
    pub error: StoreError,
}

/// Reads the retained log from its start, `page` events at a time (at least one), giving each
/// page to `each` in order. A page that meets a row the store cannot read
/// ([`StoreError::Corrupt`]) is read again in halves, down to that one row, so that every event
/// before it is given; the log is read no further, and the answer says where it stopped (what a
/// pass of pruning does with such rows, it deletes in their turn: a reader that counts or
/// audits the log says what it could not read). Used by [`audit_store`] and by the CLI's
/// `prune --dry-run`.
///
/// # Errors
///
/// The store's first error that is not [`StoreError::Corrupt`].
pub async fn read_log(
    store: &dyn AwarenessStore,
    page: usize,
    mut each: impl FnMut(Vec<Arc<Event>>),
) -> Result<Option<UnreadableRow>, StoreError> {
    let page = page.max(1);
    let (mut after, mut limit) = (Sequence::ZERO, page);
    loop {
        let events = match store.events_after(after, limit).await {
            Ok(events) => events,
            Err(StoreError::Corrupt { .. }) if limit > 1 => {
                limit /= 2;
                continue;
            }
            Err(error @ StoreError::Corrupt { .. }) => {
                return Ok(Some(UnreadableRow { after, error }));
            }
            Err(e) => return Err(e),
        };
        let Some(last) = events.last() else {
            return Ok(None);
        };
        after = last.sequence;
        each(events);
    }
}

/// `finding` if it holds in a fresh read of its session or cursor (events or the cursor
/// first, then the head, as [`audit_store`] reads), or what that read found instead: a head
/// that cannot be read.
async fn still_found(
    store: &dyn AwarenessStore,
    finding: Finding,
) -> Result<Option<Finding>, StoreError> {
    let fresh = match &finding {
        Finding::EventsWithoutHead { session, .. } => {
            // A head that cannot be read (which a page of the session's events reads too).
            if let Err(e @ StoreError::Corrupt { .. }) =
                store.heads(std::slice::from_ref(session)).await
            {
                return Ok(Some(unreadable_head(session, &e)));
            }
            let page = match store.changes_since(session, Sequence::ZERO, 1).await {
                Ok(page) => page.events,
                // A row of the session the store cannot read (reported once, as the log's):
                // the session is there still, and the finding holds while it has no head.
                Err(StoreError::Corrupt { .. }) => {
                    let heads = store.heads(std::slice::from_ref(session)).await?;
                    return Ok(heads.is_empty().then_some(finding));
                }
                Err(e) => return Err(e),
            };
            let heads = store.heads(std::slice::from_ref(session)).await?;
            audit(&heads, &page, &[])
        }
        Finding::OrphanedCursor(c) => {
            let Some(now) = store.cursor(&c.watcher, &c.target).await? else {
                return Ok(None);
            };
            let session = now.target_ref();
            match store.heads(std::slice::from_ref(&session)).await {
                Err(e @ StoreError::Corrupt { .. }) => {
                    return Ok(Some(unreadable_head(&session, &e)));
                }
                heads => audit(&heads?, &[], &[now]),
            }
        }
        _ => return Ok(Some(finding)),
    };
    let holds = fresh
        .iter()
        .any(|f| std::mem::discriminant(f) == std::mem::discriminant(&finding));
    Ok(holds.then_some(finding))
}

/// The head of `session` cannot be read, for `why` and its causes.
fn unreadable_head(session: &SessionRef, why: &StoreError) -> Finding {
    Finding::UnreadableHead {
        session: session.clone(),
        reason: crate::error::ErrorChain(why).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Timestamp, WatcherKey};
    use crate::protocol::head_after;

    fn r(key: &str) -> SessionRef {
        SessionRef::parse(key, "main").unwrap()
    }

    use crate::model::test_message as event;

    fn cursor(target: &SessionRef, last_seen: u64, material: u64) -> Cursor {
        let mut c = Cursor::at(
            WatcherKey::parse("agent:main:main").unwrap(),
            target.clone(),
            Sequence(last_seen),
            Timestamp(0),
        );
        c.notified = Sequence(material);
        c.material = Sequence(material);
        c
    }

    /// Reading the log passes on a failure that is not an unreadable row (a full disk, a busy
    /// store) as the error it is: `awareness doctor` and `prune --dry-run` fail with its cause
    /// (a busy store's, which a retry gets past), rather than say the log cannot be read past
    /// event 0. (What the mutation did: every error taken for an unreadable row; review of
    /// stop 67, CY17.)
    #[cfg(feature = "testkit")]
    #[tokio::test]
    async fn reading_the_log_passes_on_a_failure_that_is_not_a_row() {
        let store = crate::testkit::failing::Failing::new("disk full");
        let mut pages = 0;
        let read = read_log(&store, 10, |_| pages += 1).await;
        assert!(matches!(read, Err(StoreError::Backend { .. })), "{read:?}");
        assert_eq!(pages, 0);
    }

    /// What `awareness doctor` prints of a cursor names its watcher, then its target: a torn
    /// cursor's and an unreadable row's. (What the mutations did: the two swapped, in the
    /// findings' text or in the unreadable row's; review of stop 69, CQ32 and CQ31.)
    #[test]
    fn a_cursors_finding_names_its_watcher_then_its_target() {
        let torn = cursor(&r("agent:main:a"), 3, 1);
        assert_eq!(
            Finding::TornCursor(torn).to_string(),
            "cursor agent:main:main -> agent:main:a (main) is torn: last_seen 3 notified 1 \
             material 1"
        );
        let row = Finding::UnreadableCursor(UnreadableCursor {
            watcher: "agent:main:main".into(),
            target: "agent:main:a".into(),
            reason: "bad json".into(),
        });
        assert_eq!(
            row.to_string(),
            "cursor \"agent:main:main\" -> \"agent:main:a\" cannot be read: bad json"
        );
    }

    #[test]
    fn a_consistent_store_has_no_findings() {
        let a = r("agent:main:a");
        let events = [event(&a, 1), event(&a, 3)];
        let head = head_after(None, &events[1], Timestamp(5));
        assert!(audit(&[head], &events, &[cursor(&a, 1, 3)]).is_empty());
        assert!(audit(&[], &[], &[cursor(&a, 0, 0)]).is_empty());
    }

    #[test]
    fn each_broken_invariant_is_found() {
        let (a, b, c) = (r("agent:main:a"), r("agent:main:b"), r("agent:main:c"));
        let events = [event(&a, 1), event(&a, 4), event(&b, 2)];
        let mut head_a = head_after(None, &events[0], Timestamp(5));
        head_a.pruned_max_sequence = Sequence(9);
        let torn = {
            let mut t = cursor(&a, 3, 1);
            t.notified = Sequence(3);
            t
        };
        let found = audit(
            &[head_a],
            &events,
            &[torn.clone(), cursor(&a, 1, 6), cursor(&c, 0, 2)],
        );
        assert_eq!(
            found,
            vec![
                Finding::HeadBehindEvent {
                    session: a.clone(),
                    head: Sequence(1),
                    event: Sequence(4)
                },
                Finding::EventsWithoutHead {
                    session: b,
                    max: Sequence(2)
                },
                Finding::WatermarkAboveVersion {
                    session: a.clone(),
                    watermark: Sequence(9),
                    version: Sequence(1)
                },
                Finding::TornCursor(torn),
                Finding::CursorPastHead {
                    cursor: cursor(&a, 1, 6),
                    head: Sequence(1)
                },
                Finding::OrphanedCursor(cursor(&c, 0, 2)),
            ]
        );
        assert_eq!(
            found[0].to_string(),
            "head of agent:main:a (agent main) is 1 but an event 4 exists"
        );
        // What `awareness doctor` prints of a watermark above its version names the watermark
        // first, then the version. (What the mutation did: the two swapped in the text, so the
        // head read as pruned below its version; review of stop 72, CB33.)
        assert_eq!(
            found[2].to_string(),
            "head of agent:main:a (agent main) has pruned watermark 9 above its version 1"
        );
        // A cursor past its head is printed with its `material`, the sequence that is past the
        // head. (What the mutation did: its `last_seen` printed as the material, here 1, which
        // is not past the head 1; review of stop 72, CB34.)
        assert_eq!(
            found[4].to_string(),
            "cursor agent:main:main -> agent:main:a (main) points past the target's head 1 \
             (material 6)"
        );
    }

    /// A torn cursor is still held to its target's head: one also past the head, or on a target
    /// with no head, is reported as that too, so `awareness doctor` names every problem of the
    /// row. (What the mutation did: a torn cursor skipped the head checks, and its being past
    /// the head or orphaned went unreported; review of stop 70, AU18.)
    #[test]
    fn a_torn_cursor_is_held_to_its_targets_head_too() {
        let (a, b) = (r("agent:main:a"), r("agent:main:b"));
        let head = head_after(None, &event(&a, 2), Timestamp(5));
        let (past, orphaned) = (cursor(&a, 9, 5), cursor(&b, 9, 5));
        assert_eq!(
            audit(&[head], &[], &[past.clone(), orphaned.clone()]),
            vec![
                Finding::TornCursor(past.clone()),
                Finding::CursorPastHead {
                    cursor: past,
                    head: Sequence(2)
                },
                Finding::TornCursor(orphaned.clone()),
                Finding::OrphanedCursor(orphaned),
            ],
            "a torn cursor past its head, and one with no head"
        );
    }

    /// Cursors on a bare key as OpenClaw leaves them, read with the watcher's agent: one that
    /// `main`'s recordings on `global` moved past the `ops` session's head, and one seeded from
    /// `main`'s head for an agent with no `global`. Both were reported broken (past the head,
    /// orphaned) in a file OpenClaw kept whole; one past every agent's head, or on a key no
    /// agent has a head of, still is, and an agent-qualified key is held to its own head.
    #[test]
    fn a_cursor_on_a_bare_key_is_held_to_the_highest_head_of_the_key() {
        let global = |agent: &str| SessionRef::parse("global", agent).unwrap();
        let on = |watcher: &str, target: SessionRef, material: u64| {
            let mut c = cursor(&target, material, material);
            c.watcher = WatcherKey::parse(watcher).unwrap();
            c
        };
        let heads = [
            head_after(None, &event(&global("main"), 11), Timestamp(5)),
            head_after(None, &event(&global("ops"), 9), Timestamp(5)),
        ];
        let moved = on("agent:ops:main", global("ops"), 11);
        let seeded = on("agent:dev:main", global("dev"), 7);
        assert_eq!(audit(&heads, &[], &[moved, seeded]), vec![]);
        let past = on("agent:ops:main", global("ops"), 12);
        let nowhere = on(
            "agent:ops:main",
            SessionRef::parse("other", "ops").unwrap(),
            3,
        );
        let qualified = on(
            "agent:main:main",
            SessionRef::parse("agent:ops:global", "ops").unwrap(),
            1,
        );
        assert_eq!(
            audit(
                &heads,
                &[],
                &[past.clone(), nowhere.clone(), qualified.clone()]
            ),
            vec![
                Finding::CursorPastHead {
                    cursor: past,
                    head: Sequence(11)
                },
                Finding::OrphanedCursor(nowhere),
                Finding::OrphanedCursor(qualified),
            ]
        );
    }
}
