//! The paired-node provider: a thread hosted by a paired node (kind [`PAIRED_NODE`]; the link's
//! `host_id` names the node, `thread_id` the thread), read through the [`PairedNodeClient`] port
//! the gateway implements over its node connection.
//!
//! The marker is the id of the newest item already seen (`{"uuid": "<id>"}`, or
//! `{"uuid": null}` for a thread that was empty when adopted), with the ids of up to
//! [`MAX_ANCHORS`] items just older than it, nearest first, as known when it was set (its
//! anchors: `{"uuid": "<id>", "anchors": ["<id>", ...]}`). A check reads the newest items, 50
//! at a time, and **pages back until it reaches the marker**, so a burst larger than one window
//! is counted whole (OpenClaw v1 read only the newest 50, DESIGN.md section 9 item 5). It stops
//! at the marker's item or at the first anchor it meets: the marker's item deleted or
//! regenerated (a chat UI's "regenerate" replaces the newest reply; an edited turn replaces
//! itself and what followed) leaves the nearest anchor that is left, and every item seen
//! between it and the marker's item is gone, so the items newer than it are the new ones.
//! (With the id alone, such a check reached the thread's start without meeting the marker and
//! rebased, losing the turns typed since, or, on a thread longer than the paging bound, read
//! old history as new turns, segment by segment.) When the marker moves to a new newest item,
//! its anchors are the items read just below it, then, while fewer than four, the item the read
//! stopped at and its older anchors; a rebase keeps the items its read gave below the new
//! marker. A marker without a `uuid` key, or with a key we never write, is not one of ours: the
//! link is rebased to the newest item, counting nothing ([`PairedMarker::from_value`]).
//! `anchors` (and a resume point's `top_anchors`) are keys this version writes: a version
//! before it rebases a link whose marker has them, the fate of any marker it cannot read.
//!
//! A node that answers no items at all (restarting, still loading the thread) concludes
//! nothing: a stored marker stays (a resume point included), and a link without a usable
//! marker fails the check, which is asked again, rather than being stored as "no item", which
//! would count the thread's whole history as new turns at the next check. So an adopter of a
//! thread it knows to be empty stores `{"uuid": null}` itself; adopted without a marker, such
//! a thread fails each check until its first item, which the check then rebases onto without
//! counting it.
//!
//! One check reads at most [`MAX_PAGES`] pages, for at most [`PAGING_TIME`] (a slow node). A
//! check that stops there without reaching the
//! marker records the human turns it read and keeps the marker where it was, adding a
//! [`Resume`] point: the node's cursor of the next older page, the item that was newest
//! when the bound was first hit, and the items just below it (`{"uuid": "<id>", "resume":
//! {"before": "<cursor>", "top": "<id>", "top_anchors": ["<id>", ...]}}`, logged). The next
//! check reads on from that cursor, not from the newest item, and records the human turns of
//! that older segment as their own event (named by the segment's newest human turn, so it is
//! never taken for the first). Once it reaches the marker (or an anchor), the marker moves to
//! `top`, anchored at `top_anchors`, without a resume point, and the check after reads what
//! was added since. A check that hits the bound again moves only the cursor on. So a burst of
//! any length is counted whole, 2,500 items a check, and each segment is recorded once.
//!
//! When a resumed check reaches the thread's start without meeting the marker's item or an
//! anchor (the thread was rewritten), or the node no longer knows the stored cursor of a
//! thread it still has, the marker is rebased to `top` (anchored at `top_anchors`) and nothing
//! older is counted, as for any rewritten thread. A check that fails midway (the node errs)
//! concludes nothing, so the marker, resume point included, stays as it was. Markers stored
//! before resume points or anchors existed read as before and are written back in the same
//! form while the marker stays; the first check that moves one gives it anchors (a resume
//! point stored without `top_anchors` moves the marker to its `top` without any). A thread
//! longer than the bound that was rewritten under its marker and all its anchors looks like a
//! long burst until the reading reaches its start, so its turns are recorded segment by
//! segment until then (docs/decisions/0004).

use std::collections::HashSet;
use std::sync::Arc;

use awareness_core::upstream::{self, NormalizedText, TextFingerprint};
use awareness_core::{UpstreamLink, async_trait};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::warn;

use super::transcript::{TEXT_PREFIX_CHARS, Verdict, text_verdict};
use super::{CheckOutcome, UpstreamProvider};

/// The `upstream_kind` of a thread on a paired node.
pub const PAIRED_NODE: &str = "paired-node";

/// Items asked for per page (the node's window).
pub const PAGE_ITEMS: usize = 50;

/// Pages read in one check at most (2,500 items).
pub const MAX_PAGES: usize = 50;

/// How long one check pages back at most before it stops as at [`MAX_PAGES`]: two thirds of
/// the monitor's default check timeout (`MonitorConfig::provider_timeout`, 45 s), so that a slow
/// node's check ends with what it read, and a resume point, instead of timing out with nothing
/// and starting over from the newest item at every tick.
pub const PAGING_TIME: std::time::Duration = std::time::Duration::from_secs(30);

/// One item of a paired node's thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairedItem {
    /// Its id (the marker's `uuid`).
    pub id: String,
    /// `user`, `assistant`, `tool`, ...
    pub role: String,
    /// Its text.
    pub text: String,
    /// Delivered from another session (inter-session provenance).
    pub inter_session: bool,
    /// Written by a subagent of the thread.
    pub sidechain: bool,
    /// Carries a part that is not text (an image, a file): a person's item of such parts
    /// alone, with no text, is still a human turn, as a transcript line of them is.
    pub non_text: bool,
}

impl PairedItem {
    /// A `user` item typed by a person.
    pub fn user(id: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            role: "user".into(),
            text: text.into(),
            inter_session: false,
            sidechain: false,
            non_text: false,
        }
    }

    /// An item of another role.
    pub fn with_role(
        id: impl Into<String>,
        role: impl Into<String>,
        text: impl Into<String>,
    ) -> Self {
        Self {
            role: role.into(),
            ..Self::user(id, text)
        }
    }

    /// Whether this item is a human turn (a person's `user` item, under the same text rules
    /// as a transcript line).
    pub fn verdict(&self, own: &[TextFingerprint]) -> Verdict {
        use super::transcript::SkipReason;
        if self.role != "user" {
            return Err(SkipReason::Assistant);
        }
        if self.sidechain {
            return Err(SkipReason::Sidechain);
        }
        if self.inter_session {
            return Err(SkipReason::InterSession);
        }
        let mut text = NormalizedText::new(TEXT_PREFIX_CHARS);
        text.push_str(&self.text);
        text_verdict(&text, self.non_text, own)
    }
}

/// One page of a thread, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PairedPage {
    /// The items, newest first.
    pub items: Vec<PairedItem>,
    /// The cursor of the next older page, when there is one.
    pub older: Option<String>,
}

/// Why a paired node did not answer with a page.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PairedError {
    /// The node says the thread does not exist (any more), or does not know the cursor
    /// `before` it was asked from.
    #[error("thread not found")]
    NotFound,
    /// The node could not be asked or failed.
    #[error("paired node unavailable: {0}")]
    Unavailable(String),
}

/// The remote call a paired-node provider needs (the gateway implements it over its node link).
#[async_trait]
pub trait PairedNodeClient: Send + Sync {
    /// Up to `limit` items of `thread_id` on `host_id`, newest first, older than the cursor
    /// `before` when given. A cursor the node no longer knows (it restarted, say) must be
    /// answered with [`PairedError::NotFound`], not `Unavailable`: a check that stopped at the
    /// paging bound stores one and reads on from it, and gives it up only on `NotFound` (the
    /// thread still answering its newest page); `Unavailable` is taken as passing, so the check
    /// would fail on every tick.
    async fn newest(
        &self,
        host_id: &str,
        thread_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<PairedPage, PairedError>;
}

/// Anchors a marker keeps at most ([`PairedMarker::anchors`], [`Resume::top_anchors`]).
pub const MAX_ANCHORS: usize = 4;

/// The marker of a paired-node link: an object with a `uuid` key (a string, or `null`) and
/// nothing but an optional `anchors` and `resume` beside it, the shapes
/// [`PairedMarker::to_value`] writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairedMarker {
    /// The newest item seen; `None` when the thread was empty.
    pub uuid: Option<String>,
    /// The ids of up to [`MAX_ANCHORS`] items just older than `uuid`, nearest first, as known
    /// when the marker was set: a read stops at the first of `uuid` and these it meets, so the
    /// marker's item deleted or regenerated costs nothing while one of them is left. Stored
    /// only when there are some, so a marker without them keeps the form markers had before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anchors: Vec<String>,
    /// Where a check that hit the paging bound stopped, when one did: the next check reads on
    /// from there down to `uuid`. Stored only when present, so a marker without one keeps the
    /// form markers had before (`{"uuid": ...}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
}

/// Where paging back stopped at the bound of a check, with items older still to be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// The node's cursor of the next older page to read (a page's `older`).
    pub before: String,
    /// The newest item when the bound was first hit, where the marker moves once the reading
    /// reaches `uuid`. Stored `None` until 12-05 (stop 53) when nothing was read before the
    /// bound (a node answering empty pages); such a resume point is no longer written, and a
    /// stored one is not followed: the check reads from the newest item, since the marker,
    /// staying at `uuid` once the segment was read, had the segment counted twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top: Option<String>,
    /// The ids of up to [`MAX_ANCHORS`] items just older than `top`, nearest first, read by the
    /// check that first hit the bound: the anchors of the marker once it moves to `top`.
    /// Stored only when there are some (a resume point stored before anchors has none, and its
    /// `top` gets none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_anchors: Vec<String>,
}

impl PairedMarker {
    /// The marker at `uuid`, without anchors, with nothing to resume.
    pub fn at(uuid: Option<String>) -> Self {
        Self {
            uuid,
            anchors: Vec::new(),
            resume: None,
        }
    }

    /// As stored in the link. Should the anchors make it too large for a marker the store
    /// accepts (ids of kilobytes), they are left out: the marker works as one without them.
    pub fn to_value(&self) -> Value {
        let value = serde_json::to_value(self).unwrap_or(Value::Null);
        let anchored = !self.anchors.is_empty()
            || self
                .resume
                .as_ref()
                .is_some_and(|r| !r.top_anchors.is_empty());
        if anchored && upstream::validate_json("marker", Some(&value)).is_err() {
            let mut bare = self.clone();
            bare.anchors.clear();
            if let Some(resume) = &mut bare.resume {
                resume.top_anchors.clear();
            }
            return serde_json::to_value(bare).unwrap_or(Value::Null);
        }
        value
    }

    /// A stored marker, `None` when it is not one of ours (the link is then rebased): not an
    /// object, an object without a `uuid` key (`{}`, a transcript's `{"offset": 0}`), or one
    /// with a key we never write. Read as "the thread was empty" (`uuid: None`), such a marker
    /// had the thread's whole history counted as new human turns. (`anchors` and
    /// `top_anchors` are keys we write: an earlier version, which did not, rebases a link whose
    /// marker has them.) Anchors past [`MAX_ANCHORS`] (a marker edited by hand) are dropped.
    pub fn from_value(value: &Value) -> Option<Self> {
        // A missing `Option` field would be read as `None`: the key is required here.
        if !value.as_object()?.contains_key("uuid") {
            return None;
        }
        let mut marker: Self = serde_json::from_value(value.clone()).ok()?;
        marker.anchors.truncate(MAX_ANCHORS);
        if let Some(resume) = &mut marker.resume {
            resume.top_anchors.truncate(MAX_ANCHORS);
        }
        Some(marker)
    }

    /// The ids a read back stops at, nearest first: `uuid`, then the anchors.
    fn stops(&self) -> Vec<&str> {
        self.uuid
            .as_deref()
            .into_iter()
            .chain(self.anchors.iter().map(String::as_str))
            .collect()
    }

    /// The marker at `top`, anchored at the first [`MAX_ANCHORS`] of `below` (the ids just
    /// older than `top`, nearest first), each once and `top` not among them.
    fn anchored<'a>(top: String, below: impl IntoIterator<Item = &'a str>) -> Self {
        let anchors = anchors_below(&top, below);
        Self {
            uuid: Some(top),
            anchors,
            resume: None,
        }
    }
}

/// The first [`MAX_ANCHORS`] of `below`, each once and without `top`.
fn anchors_below<'a>(top: &str, below: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut anchors: Vec<String> = Vec::with_capacity(MAX_ANCHORS);
    for id in below {
        if anchors.len() == MAX_ANCHORS {
            break;
        }
        if id != top && !anchors.iter().any(|a| a == id) {
            anchors.push(id.to_owned());
        }
    }
    anchors
}

/// The items one read back found, newest first, and where it stopped.
struct Segment {
    /// The items newer than the marker's item or the anchor met (and older than the cursor it
    /// started from),
    /// judged as each page came: their texts are not kept, so a read of many long items holds
    /// one page of text at a time.
    items: Vec<Judged>,
    end: End,
}

/// An item of a [`Segment`]: its id, and whether it is a human turn ([`PairedItem::verdict`]).
struct Judged {
    id: String,
    human: bool,
}

enum End {
    /// At the marker's item or one of its anchors: the index of the one met among
    /// [`PairedMarker::stops`] (the nearest left; the ones before it are gone).
    Marker(usize),
    /// At the thread's start, without meeting the marker's item or an anchor.
    Start,
    /// At the paging bound: the cursor of the next older page.
    Bound(String),
}

/// Reads threads on paired nodes (links of kind [`PAIRED_NODE`]).
pub struct PairedNodeProvider {
    client: Arc<dyn PairedNodeClient>,
    page_items: usize,
    max_pages: usize,
    paging_time: std::time::Duration,
}

impl std::fmt::Debug for PairedNodeProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairedNodeProvider")
            .field("page_items", &self.page_items)
            .field("max_pages", &self.max_pages)
            .field("paging_time", &self.paging_time)
            .finish_non_exhaustive()
    }
}

impl PairedNodeProvider {
    /// Pages of [`PAGE_ITEMS`], at most [`MAX_PAGES`] a check and for at most
    /// [`PAGING_TIME`].
    pub fn new(client: Arc<dyn PairedNodeClient>) -> Self {
        Self {
            client,
            page_items: PAGE_ITEMS,
            max_pages: MAX_PAGES,
            paging_time: PAGING_TIME,
        }
    }

    /// Pages back for at most `time` a check (its first page is always read, however long it
    /// takes; a later one is given up at that time): keep it below the monitor's
    /// `provider_timeout`, or a check of a slow node times out with nothing. A time the clock
    /// cannot reach (`Duration::MAX`) is a century: no bound, in practice.
    #[must_use]
    pub fn with_paging_time(mut self, time: std::time::Duration) -> Self {
        self.paging_time = time;
        self
    }

    /// At most `pages` pages a check (at least 1).
    #[must_use]
    pub fn with_max_pages(mut self, pages: usize) -> Self {
        self.max_pages = pages.max(1);
        self
    }

    async fn page(
        &self,
        link: &UpstreamLink,
        before: Option<&str>,
        limit: usize,
    ) -> Result<PairedPage, CheckOutcome> {
        self.client
            .newest(&link.host_id, &link.thread_id, before, limit)
            .await
            .map_err(|e| match e {
                PairedError::NotFound => CheckOutcome::Missing,
                PairedError::Unavailable(why) => CheckOutcome::Failed(why),
            })
    }

    /// Pages back from `before` (the newest item when `None`) until the first of the items
    /// `stops` it meets (the marker's item and its anchors, [`PairedMarker::stops`]), the
    /// thread's start or the paging bound. A node that gives an older cursor it already gave
    /// in this read fails the check, so a read never goes round in a circle.
    async fn read_back(
        &self,
        link: &UpstreamLink,
        own: &[TextFingerprint],
        stops: &[&str],
        mut before: Option<String>,
    ) -> Result<Segment, CheckOutcome> {
        let mut items = Vec::new();
        let mut cursors: HashSet<String> = before.iter().cloned().collect();
        let mut pages = 0;
        let deadline = crate::config::after(tokio::time::Instant::now(), self.paging_time);
        loop {
            pages += 1;
            let answer = self.page(link, before.as_deref(), self.page_items);
            // The first page is always read (the monitor's timeout bounds it); a later one is
            // given up at the deadline, mid-page, and the check ends as at the page bound,
            // resuming from the cursor it was reading.
            let answer = if pages == 1 {
                answer.await
            } else {
                match tokio::time::timeout_at(deadline, answer).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        return Ok(Segment {
                            items,
                            end: End::Bound(before.unwrap_or_default()),
                        });
                    }
                }
            };
            let page = match answer {
                // A cursor the node gave in this very read and no longer knows (it restarted
                // mid-check) says nothing of the thread, whose newest page it just answered:
                // the check fails and is made again, instead of counting towards `Missing`.
                Err(CheckOutcome::Missing) if pages > 1 => {
                    return Err(CheckOutcome::Failed(format!(
                        "the paired node no longer knows the older cursor {:?} it gave while \
                         paging back; nothing is counted",
                        before.unwrap_or_default()
                    )));
                }
                page => page?,
            };
            for item in page.items {
                if let Some(at) = stops.iter().position(|s| *s == item.id) {
                    return Ok(Segment {
                        items,
                        end: End::Marker(at),
                    });
                }
                let human = item.verdict(own).is_ok();
                items.push(Judged { id: item.id, human });
            }
            let Some(cursor) = page.older else {
                return Ok(Segment {
                    items,
                    end: End::Start,
                });
            };
            if !cursors.insert(cursor.clone()) {
                return Err(CheckOutcome::Failed(format!(
                    "the paired node gave the older cursor {cursor:?} twice while paging back; \
                     nothing is counted"
                )));
            }
            if pages >= self.max_pages || tokio::time::Instant::now() >= deadline {
                return Ok(Segment {
                    items,
                    end: End::Bound(cursor),
                });
            }
            before = Some(cursor);
        }
    }

    async fn check_inner(
        &self,
        link: &UpstreamLink,
        own: &[TextFingerprint],
    ) -> Result<CheckOutcome, CheckOutcome> {
        let Some(marker) = super::stored_marker(link, PairedMarker::from_value) else {
            // No usable marker: start from the thread's newest item. An empty answer (a node
            // restarting or still loading the thread) concludes nothing: stored as "no item",
            // it would have the next check count the thread's whole history as new turns. (An
            // adopter that knows the thread is empty stores `{"uuid": null}` itself.)
            let page = self.page(link, None, 1).await?;
            let Some(newest) = page.items.first() else {
                return Err(CheckOutcome::Failed(
                    "the paired node answered no items for a link without a usable marker; \
                     nothing is concluded, and the next check asks again"
                        .into(),
                ));
            };
            return Ok(CheckOutcome::Rebased {
                marker: PairedMarker::at(Some(newest.id.clone())).to_value(),
            });
        };
        if let Some(resume) = &marker.resume {
            if let Some(top) = &resume.top {
                return self.check_resumed(link, own, &marker, resume, top).await;
            }
            // A resume point from before any item was read (stored until 12-05, stop 53: see
            // `check_newest`): the segment it leads to would be counted, and then, the marker
            // not having moved, counted again under another name by the check after. Read
            // from the newest item instead, as if it had not been stored.
            let fresh = PairedMarker {
                resume: None,
                ..marker.clone()
            };
            return self.check_newest(link, own, &fresh).await;
        }
        self.check_newest(link, own, &marker).await
    }

    /// Reads from the newest item back to the marker's item, or to the nearest of its anchors
    /// left when that item is gone.
    async fn check_newest(
        &self,
        link: &UpstreamLink,
        own: &[TextFingerprint],
        marker: &PairedMarker,
    ) -> Result<CheckOutcome, CheckOutcome> {
        let stops = marker.stops();
        let read = self.read_back(link, own, &stops, None).await?;
        let top = read.items.first().map(|i| i.id.clone());
        // The ids read just below `top`, nearest first: its anchors.
        let below = read.items.iter().skip(1).map(|i| i.id.as_str());
        Ok(match read.end {
            // An empty answer (a node restarting or still loading the thread may give one)
            // says nothing of the marker's item: the marker stays. Rebased to "no item", the
            // next check would count the thread's whole history as new turns; a thread really
            // emptied is rebased at the first check that reads items without the marker's.
            End::Start if marker.uuid.is_some() && top.is_none() => {
                warn!(session_key = %link.session.session_key, host = %link.host_id,
                    thread = %link.thread_id,
                    "paired node: the thread answered no items; the marker stays, and the next check reads it again");
                CheckOutcome::Unchanged {
                    marker: marker.to_value(),
                }
            }
            End::Bound(before) => {
                let Some(top) = top else {
                    // The bound came before any item did (empty pages with older cursors, from
                    // a node still loading the thread, then the paging time or the page
                    // bound): as an empty answer, that concludes nothing, and the marker stays
                    // as it was. A resume point stored here had no item to move the marker to
                    // once its segment was read, so the check after that read the segment
                    // again from the newest item, and counted its turns a second time under
                    // another name.
                    warn!(session_key = %link.session.session_key, host = %link.host_id,
                        thread = %link.thread_id,
                        "paired node: the paging bound came before any item; the marker stays, and the next check reads from the newest item again");
                    return Ok(CheckOutcome::Unchanged {
                        marker: marker.to_value(),
                    });
                };
                let top_anchors = anchors_below(&top, below);
                let resume = Resume {
                    before,
                    top: Some(top),
                    top_anchors,
                };
                let next = PairedMarker {
                    resume: Some(resume),
                    ..marker.clone()
                };
                bound_hit(link, &read.items, next, None)
            }
            end => match top {
                // Nothing newer than the marker's item (or the anchor met): the marker stays,
                // anchors and all.
                None => CheckOutcome::Unchanged {
                    marker: marker.to_value(),
                },
                Some(top) => {
                    // The marker moves to `top`, anchored at the items read below it, then at
                    // the item the read stopped at and the anchors older than that (those
                    // before it in `stops` are gone).
                    let met: &[&str] = match end {
                        End::Marker(at) => &stops[at..],
                        _ => &[],
                    };
                    let next = PairedMarker::anchored(top, below.chain(met.iter().copied()));
                    if matches!(end, End::Start) && marker.uuid.is_some() {
                        // The marker's item and its anchors no longer exist (the thread was
                        // rewritten): start over from its newest item without counting what
                        // cannot be told apart from old history.
                        CheckOutcome::Rebased {
                            marker: next.to_value(),
                        }
                    } else {
                        counted(link, &read.items, &next, None)
                    }
                }
            },
        })
    }

    /// Reads on from where an earlier check stopped at the paging bound, back to the marker's
    /// item (or the nearest of its anchors left); items newer than `resume.top` wait for the
    /// check after.
    async fn check_resumed(
        &self,
        link: &UpstreamLink,
        own: &[TextFingerprint],
        marker: &PairedMarker,
        resume: &Resume,
        top: &str,
    ) -> Result<CheckOutcome, CheckOutcome> {
        let before = &resume.before;
        // Where the marker moves once the segment is read (or given up): `top`, anchored at the
        // items just below it that the check which first hit the bound read (the items this
        // check reads lie further back).
        let done = PairedMarker::anchored(
            top.to_owned(),
            resume.top_anchors.iter().map(String::as_str),
        );
        let stops = marker.stops();
        let read = match self
            .read_back(link, own, &stops, Some(before.clone()))
            .await
        {
            Err(CheckOutcome::Missing) => {
                // The node may no longer know the stored cursor: if the thread is still there,
                // give up the rest of the segment rather than count the thread as gone.
                self.page(link, None, 1).await?;
                warn!(session_key = %link.session.session_key, host = %link.host_id,
                    thread = %link.thread_id, cursor = %before,
                    "paired node: the thread no longer knows where the last check stopped; rebased, the items older than that are not counted");
                return Ok(CheckOutcome::Rebased {
                    marker: done.to_value(),
                });
            }
            read => read?,
        };
        // No items where the last check stopped: a node with no items at all (restarting)
        // says nothing, and the marker stays, where to read on from included, whether or not
        // it names an item (a thread adopted empty names none: moved to `top`, the rest of the
        // segment was never counted); a thread that still has items but none older than the
        // cursor (dropped, rewritten) reached its start without the marker's item, and is
        // rebased as below (or, its marker naming no item, the segment read is counted).
        if read.items.is_empty() && matches!(read.end, End::Start) {
            let newest = self.page(link, None, 1).await?;
            if newest.items.is_empty() {
                warn!(session_key = %link.session.session_key, host = %link.host_id,
                    thread = %link.thread_id, cursor = %before,
                    "paired node: the thread answered no items; the marker stays, and the next check reads on from where it stopped again");
                return Ok(CheckOutcome::Unchanged {
                    marker: marker.to_value(),
                });
            }
        }
        Ok(match read.end {
            End::Start if marker.uuid.is_some() => {
                // The marker's item and its anchors vanished meanwhile (the thread was
                // rewritten).
                CheckOutcome::Rebased {
                    marker: done.to_value(),
                }
            }
            End::Bound(next) => {
                // Only the cursor moves on: `top` and its anchors stay.
                let next = PairedMarker {
                    resume: Some(Resume {
                        before: next,
                        ..resume.clone()
                    }),
                    ..marker.clone()
                };
                bound_hit(link, &read.items, next, Some(before))
            }
            End::Marker(_) | End::Start => counted(link, &read.items, &done, Some(before)),
        })
    }
}

/// A read stopped at the paging bound: the human turns among `items`, and `next`, the marker
/// kept where it was with the place to read on from (logged). `from` as for [`counted`].
fn bound_hit(
    link: &UpstreamLink,
    items: &[Judged],
    mut next: PairedMarker,
    from: Option<&str>,
) -> CheckOutcome {
    warn!(session_key = %link.session.session_key, host = %link.host_id,
        thread = %link.thread_id, items = items.len(), resumed = from.is_some(),
        "paired node: the marker is further back than the paging bound; counting the items read, and reading on from there next check");
    if upstream::validate_json("marker", Some(&next.to_value())).is_err() {
        // The node's cursor (or an id) is too long for a marker the store accepts: stored, it
        // would be refused at every check and the link would never move. The items older
        // than the bound are given up instead, and the marker moves to the newest item.
        warn!(session_key = %link.session.session_key, host = %link.host_id,
            thread = %link.thread_id,
            "paired node: its paging cursor is too long to keep in the marker; the items older than the paging bound are not counted");
        next = match next.resume.take() {
            Some(Resume {
                top: Some(top),
                top_anchors,
                ..
            }) => PairedMarker::anchored(top, top_anchors.iter().map(String::as_str)),
            _ => next,
        };
    }
    counted(link, items, &next, from)
}

/// The human turns among `items` (newest first), with `next` as the marker after them. `from`
/// is the stored cursor a resumed read started from (`None` for a read from the newest item).
/// A resumed segment is named by its newest human turn and that cursor: should the marker of
/// the check before it not have been stored (a failed write, a stopped task), that check is
/// made again from the newest items, whose window may have moved on, and its segment could
/// end at the same turn; named alike, the older segment would be taken for a duplicate of it
/// and its turns never reported. A retry of a resumed check starts from the same cursor and is
/// named alike, so it is recorded once.
fn counted(
    link: &UpstreamLink,
    items: &[Judged],
    next: &PairedMarker,
    from: Option<&str>,
) -> CheckOutcome {
    let marker = next.to_value();
    let mut human = items.iter().filter(|i| i.human);
    // The burst is named by its last (newest) human turn, see `CheckOutcome::HumanTurns`.
    let Some(last) = human.next() else {
        return CheckOutcome::Unchanged { marker };
    };
    let turns = 1 + human.count();
    CheckOutcome::HumanTurns {
        turns: u32::try_from(turns).unwrap_or(u32::MAX),
        dedupe_id: match from {
            None => last.id.clone(),
            Some(cursor) => format!("{}@{cursor}", last.id),
        },
        source_id: format!("{}/{}", link.host_id, link.thread_id),
        marker,
    }
}

#[async_trait]
impl UpstreamProvider for PairedNodeProvider {
    fn kind(&self) -> &str {
        PAIRED_NODE
    }

    async fn check(&self, link: &UpstreamLink, own_recent: &[String]) -> CheckOutcome {
        let own = upstream::fingerprints(own_recent);
        self.check_inner(link, &own).await.unwrap_or_else(|o| o)
    }
}
