//! The paired-node provider: a thread hosted by a paired node (kind [`PAIRED_NODE`]; the link's
//! `host_id` names the node, `thread_id` the thread), read through the [`PairedNodeClient`] port
//! the gateway implements over its node connection.
//!
//! The marker is the id of the newest item already seen (`{"uuid": "<id>"}`, or
//! `{"uuid": null}` for a thread that was empty when adopted). A check reads the newest items,
//! 50 at a time, and **pages back until it reaches the marker**, so a burst larger than one
//! window is counted whole (OpenClaw v1 read only the newest 50, DESIGN.md section 9 item 5).
//! Paging stops after [`MAX_PAGES`] pages as a safety bound; past it the turns read are
//! recorded and the older rest of such a burst is not (logged).

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
        text_verdict(&text, false, own)
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
    /// The node says the thread does not exist (any more).
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
    /// `before` when given.
    async fn newest(
        &self,
        host_id: &str,
        thread_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<PairedPage, PairedError>;
}

/// The marker of a paired-node link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairedMarker {
    /// The newest item seen; `None` when the thread was empty.
    pub uuid: Option<String>,
}

impl PairedMarker {
    /// As stored in the link.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// A stored marker, `None` when it is not one of ours.
    pub fn from_value(value: &Value) -> Option<Self> {
        serde_json::from_value(value.clone()).ok()
    }
}

/// Reads threads on paired nodes (links of kind [`PAIRED_NODE`]).
pub struct PairedNodeProvider {
    client: Arc<dyn PairedNodeClient>,
    page_items: usize,
    max_pages: usize,
}

impl std::fmt::Debug for PairedNodeProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairedNodeProvider")
            .field("page_items", &self.page_items)
            .field("max_pages", &self.max_pages)
            .finish_non_exhaustive()
    }
}

impl PairedNodeProvider {
    /// Pages of [`PAGE_ITEMS`], at most [`MAX_PAGES`] a check.
    pub fn new(client: Arc<dyn PairedNodeClient>) -> Self {
        Self {
            client,
            page_items: PAGE_ITEMS,
            max_pages: MAX_PAGES,
        }
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

    async fn check_inner(
        &self,
        link: &UpstreamLink,
        own: &[TextFingerprint],
    ) -> Result<CheckOutcome, CheckOutcome> {
        let Some(marker) = link.marker.as_ref().and_then(PairedMarker::from_value) else {
            // No usable marker: start from the thread's newest item.
            let page = self.page(link, None, 1).await?;
            let uuid = page.items.first().map(|i| i.id.clone());
            return Ok(CheckOutcome::Rebased {
                marker: PairedMarker { uuid }.to_value(),
            });
        };
        // Items newer than the marker, newest first.
        let mut newer: Vec<PairedItem> = Vec::new();
        let mut before: Option<String> = None;
        let mut found = false;
        let mut exhausted = false;
        for pages in 1..=self.max_pages {
            let page = self.page(link, before.as_deref(), self.page_items).await?;
            for item in page.items {
                if marker.uuid.as_deref() == Some(item.id.as_str()) {
                    found = true;
                    break;
                }
                newer.push(item);
            }
            if found {
                break;
            }
            let Some(cursor) = page.older else {
                exhausted = true;
                break;
            };
            before = Some(cursor);
            if pages == self.max_pages {
                warn!(session_key = %link.session.session_key, host = %link.host_id,
                    thread = %link.thread_id, items = newer.len(),
                    "paired node: the marker is further back than the paging bound; counting the items read");
            }
        }
        if exhausted && !found && marker.uuid.is_some() {
            // The marker's item no longer exists (the thread was rewritten): start over from its
            // newest item without counting what cannot be told apart from old history.
            let uuid = newer.first().map(|i| i.id.clone());
            return Ok(CheckOutcome::Rebased {
                marker: PairedMarker { uuid }.to_value(),
            });
        }
        let Some(newest) = newer.first().map(|i| i.id.clone()) else {
            return Ok(CheckOutcome::Unchanged {
                marker: marker.to_value(),
            });
        };
        let next = PairedMarker { uuid: Some(newest) }.to_value();
        let human: Vec<&PairedItem> = newer
            .iter()
            .rev()
            .filter(|i| i.verdict(own).is_ok())
            .collect();
        // The burst is named by its last (newest) human turn, see `CheckOutcome::HumanTurns`.
        Ok(match human.last() {
            Some(last) => CheckOutcome::HumanTurns {
                turns: u32::try_from(human.len()).unwrap_or(u32::MAX),
                dedupe_id: last.id.clone(),
                source_id: format!("{}/{}", link.host_id, link.thread_id),
                marker: next,
            },
            None => CheckOutcome::Unchanged { marker: next },
        })
    }
}

#[async_trait]
impl UpstreamProvider for PairedNodeProvider {
    fn kind(&self) -> &str {
        PAIRED_NODE
    }

    async fn check(&self, link: &UpstreamLink, own_recent: &[String]) -> CheckOutcome {
        let own = upstream::own_fingerprints(own_recent);
        self.check_inner(link, &own).await.unwrap_or_else(|o| o)
    }
}
