//! The paired-node provider (`gateway_adapter::upstream::paired`) against a node whose thread
//! changes as a chat does, between checks (never during one): a person's turns, replies, the
//! agent's own prompts echoed back, a reply regenerated, a turn edited (it and what followed
//! replaced), the node failing mid-read, pages of any size and a paging bound of one to three
//! pages, the marker stored as JSON between checks.
//!
//! An edit or a regeneration never takes the marker's item and all its anchors, a resume
//! point's cursor, or its top and all of its anchors (what decision 0004 leaves to a rebase),
//! so a check never rebases. Each check that goes through counts exactly the person's turns
//! among the items it was served before the first item it stops at (the marker's or an
//! anchor), names the burst by the newest of them (and the cursor it read from, when it
//! resumed), and never counts an item an earlier check counted; a check fails only when the
//! node failed a page it asked for; the marker it leaves is anchored at the items just below
//! its item in the thread, and a resume point's top at the items just below that (see
//! [`Depths`]); once checks reach the marker, every turn left in the thread was counted.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use awareness_core::{SessionRef, Timestamp, UpstreamLink, async_trait};
use gateway_adapter::upstream::paired::{
    PAIRED_NODE, PairedError, PairedItem, PairedMarker, PairedNodeClient, PairedNodeProvider,
    PairedPage,
};
use gateway_adapter::upstream::{CheckOutcome, UpstreamProvider};

/// The session's own prompt (its echo in the thread is no person's turn).
const OWN: &str = "own prompt";

#[derive(Default)]
struct Node {
    /// Oldest first.
    thread: Vec<PairedItem>,
    /// Items per page the node gives (it may give fewer than asked).
    page: usize,
    /// The page request that fails, counted from 1 within a check.
    fail_at: Option<usize>,
    calls: usize,
    /// The items served in this check, in the order served (newest first per page).
    served: Vec<PairedItem>,
}

struct Client(Arc<Mutex<Node>>);

#[async_trait]
impl PairedNodeClient for Client {
    async fn newest(
        &self,
        _host: &str,
        _thread: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<PairedPage, PairedError> {
        let mut node = self.0.lock().unwrap();
        node.calls += 1;
        if node.fail_at == Some(node.calls) {
            return Err(PairedError::Unavailable("the node failed".into()));
        }
        // A cursor is the id of the oldest item of the page before.
        let end = match before {
            Some(c) => node
                .thread
                .iter()
                .position(|i| i.id == c)
                .ok_or(PairedError::NotFound)?,
            None => node.thread.len(),
        };
        let start = end.saturating_sub(limit.min(node.page));
        let items: Vec<PairedItem> = node.thread[start..end].iter().rev().cloned().collect();
        node.served.extend(items.iter().cloned());
        let older = (start > 0).then(|| node.thread[start].id.clone());
        Ok(PairedPage { items, older })
    }
}

/// How many anchors the oracle expects the marker, and a resume point's top, to have: up to
/// four, fewer when fewer were known when it was set.
///
/// The module doc of `paired.rs`: "When the marker moves to a new newest item, its anchors are
/// the items read just below it, then, while fewer than four, the item the read stopped at and
/// its older anchors". This fake node serves a thread's items contiguously, newest first, and
/// items are only deleted at the top of the thread (a regeneration or an edit replaces the
/// newest items), between checks, never the stop a check then meets: so the items read below
/// the new top, the stop met and that stop's own older anchors are, in that order, the items
/// just below the top in the thread as it is after the check, and stay so while the top is in
/// the thread. A resume point's `top_anchors` are likewise the items read just below its top.
/// But "up to four" is not always four, nor all the items below when there are fewer: a check
/// stopped at a short paging bound (a page of one item, one page) read fewer than four items
/// below its top, so its `top_anchors` are fewer, and the marker that moves to that top once
/// the segment is read gets only those, and a marker moved later onto an item just above it
/// gets that item and those, and so on. So the oracle counts, from what each check read, how
/// many anchors were known, and expects exactly that many of the items just below (a provider
/// writing none, too few, too many or others fails).
#[derive(Debug, Default, Clone, Copy)]
struct Depths {
    /// The marker's anchors.
    marker: usize,
    /// A stored resume point's `top_anchors` (0 without one).
    top: usize,
}

/// Runs the target on one input (any bytes); panics on a failure. Whether a check counted a
/// human turn that was compared with what the node served.
pub fn run(data: &[u8]) -> bool {
    let node = Arc::new(Mutex::new(Node {
        page: 50,
        ..Node::default()
    }));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let own = vec![OWN.to_owned()];
    let mut link = UpstreamLink {
        session: SessionRef::parse("agent:main:main", "main").expect("a session"),
        catalog_id: "node".into(),
        host_id: "node".into(),
        thread_id: "t".into(),
        upstream_kind: PAIRED_NODE.into(),
        upstream_ref: None,
        // Adopted while the thread was empty.
        marker: Some(PairedMarker::at(None).to_value()),
        last_scanned_at: None,
        created_at: Timestamp::now(),
        updated_at: Timestamp::now(),
    };
    let mut counted: HashSet<String> = HashSet::new();
    let mut depths = Depths::default();
    let mut compared = false;
    let mut n = 0u32;
    let mut next_id = |prefix: &str| {
        n += 1;
        format!("{prefix}{n}")
    };

    let mut bytes = data.iter().copied();
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        let mut node_now = node.lock().unwrap();
        match op % 6 {
            0 => node_now
                .thread
                .push(PairedItem::user(next_id("h"), "a person types")),
            1 => node_now
                .thread
                .push(PairedItem::with_role(next_id("a"), "assistant", "a reply")),
            2 => node_now.thread.push(PairedItem::user(next_id("o"), OWN)),
            3 => {
                // Regenerate the newest reply.
                if node_now
                    .thread
                    .last()
                    .is_some_and(|i| i.role == "assistant")
                    && edit_keeps_a_stop(&link, &node_now.thread, 1)
                {
                    node_now.thread.pop();
                    let id = next_id("r");
                    node_now
                        .thread
                        .push(PairedItem::with_role(id, "assistant", "a reply again"));
                }
            }
            4 => {
                // Edit a turn: it and what followed are replaced by a new turn.
                let k = usize::from(arg % 4) + 1;
                if k <= node_now.thread.len() && edit_keeps_a_stop(&link, &node_now.thread, k) {
                    let len = node_now.thread.len();
                    node_now.thread.truncate(len - k);
                    node_now
                        .thread
                        .push(PairedItem::user(next_id("e"), "a person edits"));
                }
            }
            _ => {
                node_now.page = usize::from(arg % 5) + 1;
                node_now.fail_at = (arg & 0x80 != 0).then_some(usize::from(arg >> 5 & 3) + 1);
                drop(node_now);
                let pages = usize::from(arg >> 3 & 3).max(1);
                let (turns, _) = check(
                    &runtime,
                    &node,
                    &mut link,
                    &own,
                    pages,
                    &mut counted,
                    &mut depths,
                );
                compared |= turns;
            }
        }
    }
    // Checks without bounds or failures until one finds nothing (the first reads on from a
    // resume point, the second what was added since, the third nothing, as a rule): then every
    // turn left is counted.
    {
        let mut node_now = node.lock().unwrap();
        node_now.page = 50;
        node_now.fail_at = None;
    }
    let mut quiet = false;
    for _ in 0..100 {
        let (turns, nothing) = check(
            &runtime,
            &node,
            &mut link,
            &own,
            1000,
            &mut counted,
            &mut depths,
        );
        compared |= turns;
        if nothing {
            quiet = true;
            break;
        }
    }
    assert!(
        quiet,
        "100 checks and still finding something: {:?}",
        link.marker
    );
    let thread = node.lock().unwrap().thread.clone();
    for item in &thread {
        if item.id.starts_with('h') || item.id.starts_with('e') {
            assert!(counted.contains(&item.id), "{} never counted", item.id);
        }
    }
    compared
}

/// The ids of the `n` items just below `id` in `thread`, nearest first (fewer at its start);
/// `None` when `id` is not in it.
fn below(thread: &[PairedItem], id: &str, n: usize) -> Option<Vec<String>> {
    let at = thread.iter().position(|i| i.id == id)?;
    Some(
        thread[..at]
            .iter()
            .rev()
            .take(n)
            .map(|i| i.id.clone())
            .collect(),
    )
}

/// Whether replacing the newest `k` items leaves one of the marker's stops, and, while a
/// resume point is stored, its cursor and one of its top's stops (else decision 0004's
/// rebase is what follows, which this target does not check).
fn edit_keeps_a_stop(link: &UpstreamLink, thread: &[PairedItem], k: usize) -> bool {
    let marker =
        PairedMarker::from_value(link.marker.as_ref().expect("a marker")).expect("our marker");
    let kept: HashSet<&str> = thread[..thread.len() - k]
        .iter()
        .map(|i| i.id.as_str())
        .collect();
    let any_kept = |first: &String, rest: &[String]| {
        std::iter::once(first)
            .chain(rest)
            .any(|id| kept.contains(id.as_str()))
    };
    let marker_ok = marker
        .uuid
        .as_ref()
        .is_none_or(|uuid| any_kept(uuid, &marker.anchors));
    let resume_ok = marker.resume.as_ref().is_none_or(|r| {
        kept.contains(r.before.as_str())
            && r.top
                .as_ref()
                .is_none_or(|top| any_kept(top, &r.top_anchors))
    });
    marker_ok && resume_ok
}

/// One check with a bound of `pages`, compared with what the node served. Whether it counted
/// human turns (compared with the ones served), and whether it found nothing: unchanged,
/// the marker as it was, without a resume point.
fn check(
    runtime: &tokio::runtime::Runtime,
    node: &Arc<Mutex<Node>>,
    link: &mut UpstreamLink,
    own: &[String],
    pages: usize,
    counted: &mut HashSet<String>,
    depths: &mut Depths,
) -> (bool, bool) {
    let before: PairedMarker =
        PairedMarker::from_value(link.marker.as_ref().expect("a marker")).expect("our marker");
    assert_eq!(before.anchors.len(), depths.marker, "{before:?}");
    assert_eq!(
        before.resume.as_ref().map_or(0, |r| r.top_anchors.len()),
        depths.top,
        "{before:?}"
    );
    {
        let mut n = node.lock().unwrap();
        n.calls = 0;
        n.served.clear();
    }
    let provider = PairedNodeProvider::new(Arc::new(Client(node.clone()))).with_max_pages(pages);
    let outcome = runtime.block_on(provider.check(link, own));
    let served = std::mem::take(&mut node.lock().unwrap().served);
    let Some((marker, got)) = crate::went_through(&outcome) else {
        let CheckOutcome::Failed(why) = outcome else {
            panic!("{outcome:?} from {before:?}");
        };
        let n = node.lock().unwrap();
        assert!(
            n.fail_at.is_some_and(|at| n.calls >= at),
            "failed ({why}) though no page failed: {} pages asked for, failing at {:?}",
            n.calls,
            n.fail_at
        );
        return (false, false);
    };
    // What this check read: the items served before the first stop (the marker's item or an
    // anchor) met; a check read from a resume point's cursor was served from there.
    let stops: Vec<&String> = before.uuid.iter().chain(&before.anchors).collect();
    let read: Vec<&PairedItem> = served
        .iter()
        .take_while(|i| !stops.contains(&&i.id))
        .collect();
    let humans: Vec<&PairedItem> = read
        .iter()
        .copied()
        .filter(|i| i.id.starts_with('h') || i.id.starts_with('e'))
        .collect();
    // A segment read from a resume point's cursor is named by its newest turn and the cursor.
    let name = |id: &str| match &before.resume {
        Some(r) => format!("{id}@{}", r.before),
        None => id.to_owned(),
    };
    let expected = humans
        .first()
        .map(|newest| (humans.len() as u32, name(&newest.id)));
    assert_eq!(got, expected, "from {before:?}, served {served:?}");
    for h in &humans {
        assert!(counted.insert(h.id.clone()), "{} counted twice", h.id);
    }
    let after = PairedMarker::from_value(&marker).unwrap_or_else(|| panic!("{marker}"));
    let thread = node.lock().unwrap().thread.clone();
    anchored(&before, &after, &read, &served, &thread, depths);
    let nothing = got.is_none() && after == before && after.resume.is_none();
    link.marker = Some(marker);
    (expected.is_some(), nothing)
}

/// The marker `after` a check from `before` that read `read` of the items it was `served`
/// (newest first), with the node's `thread` as it is after it: where it moved, and that it is
/// anchored as [`Depths`] says; `depths` updated.
fn anchored(
    before: &PairedMarker,
    after: &PairedMarker,
    read: &[&PairedItem],
    served: &[PairedItem],
    thread: &[PairedItem],
    depths: &mut Depths,
) {
    let context = || format!("{before:?} then {after:?}, served {served:?}, thread {thread:?}");
    // The items just below `id` in the thread, `n` of them, when `id` is still in it.
    let expect = |id: &str, n: usize, anchors: &[String], what: &str| {
        if let Some(expected) = below(thread, id, n) {
            assert_eq!(anchors, expected, "{what} of {id}: {}", context());
        }
    };
    let newest = read.first().map(|i| i.id.clone());
    match (&before.resume, &after.resume) {
        // From the newest item, stopped at the bound: the marker stays, and the resume point's
        // top is the newest item, anchored at the items read below it.
        (None, Some(resume)) => {
            assert_eq!(
                (&after.uuid, &after.anchors),
                (&before.uuid, &before.anchors),
                "{}",
                context()
            );
            assert_eq!(resume.top, newest, "{}", context());
            depths.top = read.len().saturating_sub(1).min(4);
            if let Some(top) = &resume.top {
                expect(top, depths.top, &resume.top_anchors, "top anchors");
            }
        }
        // Read on from a resume point, stopped at the bound again: only the cursor moves.
        (Some(old), Some(resume)) => {
            assert_eq!(
                (
                    &after.uuid,
                    &after.anchors,
                    &resume.top,
                    &resume.top_anchors
                ),
                (&before.uuid, &before.anchors, &old.top, &old.top_anchors),
                "{}",
                context()
            );
        }
        // Read on from a resume point down to the marker: the marker moves to the top,
        // anchored at its anchors.
        (Some(old), None) => {
            if let Some(top) = &old.top {
                assert_eq!(
                    (after.uuid.as_ref(), &after.anchors),
                    (Some(top), &old.top_anchors),
                    "{}",
                    context()
                );
                depths.marker = depths.top;
                expect(top, depths.marker, &after.anchors, "anchors");
            } else {
                assert_eq!(
                    (&after.uuid, &after.anchors),
                    (&before.uuid, &before.anchors),
                    "{}",
                    context()
                );
            }
            depths.top = 0;
        }
        // From the newest item down to the marker: it moves to the newest item read, anchored
        // at the items read below it, then the stop met and that stop's older anchors.
        (None, None) => {
            let Some(top) = newest else {
                assert_eq!(after, before, "{}", context());
                return;
            };
            assert_eq!(after.uuid.as_ref(), Some(&top), "{}", context());
            // The items known just below the read: the stop met (the next item served) and
            // its older anchors (all the marker's below its item, those below an anchor).
            let known_below_stop = served.get(read.len()).map_or(0, |stop| {
                if before.uuid.as_ref() == Some(&stop.id) {
                    1 + depths.marker
                } else {
                    let at = before
                        .anchors
                        .iter()
                        .position(|a| *a == stop.id)
                        .expect("a read stops at a stop");
                    depths.marker - at
                }
            });
            depths.marker = (read.len() - 1 + known_below_stop).min(4);
            expect(&top, depths.marker, &after.anchors, "anchors");
        }
    }
}
