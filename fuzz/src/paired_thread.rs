//! The paired-node provider (`gateway_adapter::upstream::paired`) against a node whose thread
//! changes as a chat does between checks: a person's turns, replies, the agent's own prompts
//! echoed back, a reply regenerated, a turn edited (it and what followed replaced), the node
//! failing mid-read, pages of any size and a paging bound of one to three pages, the marker
//! stored as JSON between checks.
//!
//! An edit or a regeneration never takes the marker's item and all its anchors, a resume
//! point's cursor, or its top and all of its anchors (what decision 0004 leaves to a rebase),
//! so a check never rebases. Each check that goes through counts exactly the person's turns
//! among the items it was served before the first item it stops at (the marker's or an
//! anchor), names the burst by the newest of them (and the cursor it read from, when it
//! resumed), and never counts an item an earlier check counted; once checks reach the marker,
//! every turn left in the thread was counted.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use awareness_core::{SessionRef, Timestamp, UpstreamLink, async_trait};
use gateway_adapter::upstream::paired::{
    PAIRED_NODE, PairedError, PairedItem, PairedMarker, PairedNodeClient, PairedNodeProvider,
    PairedPage,
};
use gateway_adapter::upstream::{CheckOutcome, UpstreamProvider};
use serde_json::Value;

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

/// Runs the target on one input (any bytes); panics on a failure.
pub fn run(data: &[u8]) {
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
                check(&runtime, &node, &mut link, &own, pages, &mut counted);
            }
        }
    }
    // Checks without bounds or failures until one finds nothing: every turn left is counted.
    {
        let mut node_now = node.lock().unwrap();
        node_now.page = 50;
        node_now.fail_at = None;
    }
    for _ in 0..3 {
        check(&runtime, &node, &mut link, &own, 1000, &mut counted);
    }
    let thread = node.lock().unwrap().thread.clone();
    for item in &thread {
        if item.id.starts_with('h') || item.id.starts_with('e') {
            assert!(counted.contains(&item.id), "{} never counted", item.id);
        }
    }
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

/// One check with a bound of `pages`, compared with what the node served.
fn check(
    runtime: &tokio::runtime::Runtime,
    node: &Arc<Mutex<Node>>,
    link: &mut UpstreamLink,
    own: &[String],
    pages: usize,
    counted: &mut HashSet<String>,
) {
    let before: PairedMarker =
        PairedMarker::from_value(link.marker.as_ref().expect("a marker")).expect("our marker");
    {
        let mut n = node.lock().unwrap();
        n.calls = 0;
        n.served.clear();
    }
    let provider = PairedNodeProvider::new(Arc::new(Client(node.clone()))).with_max_pages(pages);
    let outcome = runtime.block_on(provider.check(link, own));
    let served = std::mem::take(&mut node.lock().unwrap().served);
    let (marker, got): (Value, Option<(u32, String)>) = match outcome {
        CheckOutcome::Failed(_) => {
            assert!(
                node.lock().unwrap().fail_at.is_some(),
                "failed with no failure"
            );
            return;
        }
        CheckOutcome::Unchanged { marker } => (marker, None),
        CheckOutcome::HumanTurns {
            turns,
            dedupe_id,
            marker,
            ..
        } => (marker, Some((turns, dedupe_id))),
        other => panic!("{other:?} from {before:?}"),
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
    assert!(PairedMarker::from_value(&marker).is_some(), "{marker}");
    link.marker = Some(marker);
}
