//! The notice protocol of DESIGN.md section 4, as pure functions on cursors.
//!
//! Backends load the cursors an operation touches, call these functions, and persist what they
//! return in one transaction. No backend re-derives a rule.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::model::{
    AgentId, Cursor, Event, Head, KindClass, Sequence, SessionKey, SessionRef, Timestamp,
    WatchProvenance, WatcherKey,
};
use crate::validate::ValidationError;

/// Prefix of a session-state context key in the gateway's system-event queue.
pub const CONTEXT_KEY_PREFIX: &str = "session-state:";

/// "Your view of this target is stale": one line for the watcher's system-event queue.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notice {
    /// Who must read it.
    pub watcher: WatcherKey,
    /// The session that changed.
    pub target: SessionKey,
    /// The target's agent.
    pub target_agent: AgentId,
    /// The sequence to reconcile from (`changesSince`).
    pub last_seen: Sequence,
    /// Queue it for the watcher's next turn without waking the watcher: the notice of an
    /// ambient cursor ([`WatchProvenance::AmbientGroup`]), as OpenClaw delivers it. Left out
    /// of the JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queue_only: bool,
}

impl Notice {
    /// Whether queuing this notice's line wakes its watcher: a main session is woken, unless
    /// the notice is queue-only (an ambient cursor's, decision 0015); a nested subagent sees
    /// it on its next turn.
    pub fn wakes(&self) -> bool {
        !self.queue_only && !self.watcher.session_key().is_subagent()
    }

    /// The notice of a cursor (its text depends only on the target and `last_seen`).
    pub fn of(cursor: &Cursor) -> Self {
        Self {
            watcher: cursor.watcher.clone(),
            target: cursor.target.clone(),
            target_agent: cursor.target_agent.clone(),
            last_seen: cursor.last_seen,
            queue_only: cursor.provenance == WatchProvenance::AmbientGroup,
        }
    }

    /// The exact line the watcher reads.
    pub fn text(&self) -> String {
        notice_text(&self.target, self.last_seen)
    }

    /// The queue's context key for this notice.
    pub fn context_key(&self) -> String {
        context_key(&self.target)
    }
}

/// The exact notice text of DESIGN.md section 4.
pub fn notice_text(target: &SessionKey, last_seen: Sequence) -> String {
    format!(
        "Session \"{target}\" changed (other actor). Reconcile before acting: session_status sessionKey \"{target}\" changesSince {last_seen}."
    )
}

/// `session-state:<lowercase hex of the target key's UTF-8 bytes>`.
pub fn context_key(target: &SessionKey) -> String {
    let bytes = target.as_str().as_bytes();
    let mut out = String::with_capacity(CONTEXT_KEY_PREFIX.len() + bytes.len() * 2);
    out.push_str(CONTEXT_KEY_PREFIX);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Whether a context key belongs to session awareness at all (it may still be malformed).
pub fn is_session_state_context_key(value: &str) -> bool {
    value.starts_with(CONTEXT_KEY_PREFIX)
}

/// Strictly decodes a context key: the prefix, an even number of lowercase hex digits, valid
/// UTF-8 and a valid session key; anything else is an error, so a bad key can never acknowledge
/// an unrelated cursor.
pub fn decode_context_key(value: &str) -> Result<SessionKey, ValidationError> {
    let err = |reason| ValidationError::ContextKey {
        value: value.to_owned(),
        reason,
    };
    let hex = value
        .strip_prefix(CONTEXT_KEY_PREFIX)
        .ok_or_else(|| err("missing the session-state: prefix"))?;
    if hex.is_empty() {
        return Err(err("empty target"));
    }
    if hex.len() % 2 != 0 {
        return Err(err("odd number of hex digits"));
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut bytes = Vec::with_capacity(hex.len() / 2);
    for pair in hex.as_bytes().chunks_exact(2) {
        let (Some(hi), Some(lo)) = (digit(pair[0]), digit(pair[1])) else {
            return Err(err("not lowercase hex"));
        };
        bytes.push(hi << 4 | lo);
    }
    let text = String::from_utf8(bytes).map_err(|_| err("not UTF-8"))?;
    SessionKey::new(text).map_err(|_| err("not a valid session key"))
}

/// What a line drained from a watcher's queue is, against `current`: the notices of the
/// watcher's pending cursors, read after the drain ([`classify_line`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainedLine {
    /// Not session state: the turn reads it as it is.
    Other,
    /// The current notice `current[i]`, word for word.
    Current(usize),
    /// A well-formed session-state line that is no current notice: it was already read and
    /// acknowledged (a delivery that arrived late), or its cursor is gone. The turn leaves it
    /// out.
    Stale,
    /// A session-state context key that does not decode: it acknowledges nothing, and is not
    /// ours to hide.
    Malformed(ValidationError),
}

/// Classifies a drained line by its context key, then (for the notice of the same target
/// only) its text: see [`DrainedLine`].
pub fn classify_line(text: &str, context_key: Option<&str>, current: &[Notice]) -> DrainedLine {
    let Some(key) = context_key.filter(|k| is_session_state_context_key(k)) else {
        return DrainedLine::Other;
    };
    match decode_context_key(key) {
        Err(e) => DrainedLine::Malformed(e),
        // The strict encoding is one key per target: the same target is the same key.
        Ok(target) => current
            .iter()
            .position(|n| n.target == target && n.text() == text)
            .map_or(DrainedLine::Stale, DrainedLine::Current),
    }
}

/// Checks an explicit watch request: the watcher must be agent-qualified and not the target.
pub fn check_watch(
    watcher: &SessionKey,
    target: &SessionKey,
) -> Result<WatcherKey, ValidationError> {
    let w = WatcherKey::new(watcher.clone())?;
    if w.session_key() == target {
        return Err(ValidationError::SelfWatch {
            key: target.as_str().to_owned(),
        });
    }
    Ok(w)
}

/// Seeding by a spawn at `seq`: a new cursor at `seq`, or the existing one kept when it holds a
/// pending notice on that target, as a repeated [`watch`] keeps one: its sequences stay, it is
/// made explicit (as a spawn makes every watch) when it was ambient, and its `updated_at` is
/// refreshed when it is [`WATCH_REFRESH_MS`] old, so that idle pruning does not take the cursor
/// of a watcher that has just spawned the session (docs/decisions/0018). A pending cursor on
/// another agent's session of the same key is no cursor on that target: it is re-pointed here
/// at `seq`, as [`watch`] and [`on_event`] re-point one (docs/decisions/0008). Returns the
/// cursor to write, `None` to write nothing.
pub fn seed(
    existing: Option<&Cursor>,
    watcher: &WatcherKey,
    target: &SessionRef,
    seq: Sequence,
    now: Timestamp,
) -> Option<Cursor> {
    match existing {
        Some(c) if seed_keeps(c, target) => kept(c, now),
        _ => Some(Cursor::at(watcher.clone(), target.clone(), seq, now)),
    }
}

/// Whether a [`seed`] of `target` keeps `existing` (a pending notice on that very session)
/// rather than replacing it.
fn seed_keeps(existing: &Cursor, target: &SessionRef) -> bool {
    existing.is_pending() && existing.follows(target)
}

/// `cursor` kept by a repeated watch or a re-spawn: what to write when it changes, made
/// explicit when it was not, and with `updated_at := now` when that is [`WATCH_REFRESH_MS`]
/// old (nothing else changes); `None` when it stays as it is.
fn kept(cursor: &Cursor, now: Timestamp) -> Option<Cursor> {
    let stale = now.millis().saturating_sub(cursor.updated_at.millis()) >= WATCH_REFRESH_MS;
    match (explicit(cursor), stale) {
        (None, false) => None,
        (upgraded, _) => {
            let mut kept = upgraded.unwrap_or_else(|| cursor.clone());
            if stale {
                kept.updated_at = now;
            }
            Some(kept)
        }
    }
}

/// `cursor` made explicit, when it was not: what to write for a spawn or an explicit watch
/// that otherwise leaves it as it is (OpenClaw's `registerWatch` does the same).
fn explicit(cursor: &Cursor) -> Option<Cursor> {
    (cursor.provenance != WatchProvenance::Explicit).then(|| Cursor {
        provenance: WatchProvenance::Explicit,
        ..cursor.clone()
    })
}

/// Whether an explicit [`watch`] of `target` keeps `existing` and makes it explicit (an ambient
/// cursor on that very session, decision 0015), rather than leaving it as it is or replacing
/// it: the watch a gateway then wakes the watcher for, when the notice its cursor keeps
/// pending was queued without a wake while ambient.
pub fn watch_makes_explicit(existing: &Cursor, target: &SessionRef) -> bool {
    existing.follows(target) && explicit(existing).is_some()
}

/// The cursor a [`seed`] by a spawn of `target` keeps when it makes `existing` explicit (an
/// ambient cursor on that very session with a pending notice, decision 0015): the spawn a
/// gateway then wakes the watcher for, as for [`watch_makes_explicit`]. `None` when the seed
/// leaves `existing` as it is, or replaces it.
pub fn seed_makes_explicit(existing: &Cursor, target: &SessionRef) -> Option<Cursor> {
    seed_keeps(existing, target)
        .then(|| explicit(existing))
        .flatten()
}

/// How old a cursor's `updated_at` must be for a repeated [`watch`] (or a re-spawn, [`seed`])
/// to refresh it: a day. Idle pruning deletes cursors not updated for 30 days by default, so a
/// watch confirmed again keeps its cursor, while a watch asked with every status call writes at
/// most once a day (docs/decisions/0018).
pub const WATCH_REFRESH_MS: i64 = Timestamp::DAY_MS;

/// An explicit watch: keeps an existing cursor on the same ref (and its pending state; an
/// ambient one is made explicit) or starts at `head`. Returns the cursor in effect and whether
/// it must be written. A kept cursor not updated for [`WATCH_REFRESH_MS`] gets `updated_at :=
/// now`, and nothing else changes.
///
/// A cursor is keyed by watcher and target key, so `existing` may point at another agent's
/// session of the same key: watching this one re-points it here from the head, as a named
/// watcher is re-pointed by [`on_event`]; keeping it would answer with a cursor on the other
/// agent's session, and this one's changes would never notify (docs/decisions/0008).
pub fn watch(
    existing: Option<&Cursor>,
    watcher: &WatcherKey,
    target: &SessionRef,
    head: Sequence,
    now: Timestamp,
) -> (Cursor, bool) {
    match existing {
        Some(c) if c.follows(target) => match kept(c, now) {
            Some(kept) => (kept, true),
            None => (c.clone(), false),
        },
        _ => (Cursor::at(watcher.clone(), target.clone(), head, now), true),
    }
}

/// A material event at `seq` on the cursor's target: freezes `notified` when no notice is
/// outstanding, always moves `material`. A row whose `notified` is not above its `last_seen`
/// while its `material` is (a torn row, a hand edit: never written by these rules) is read as
/// frozen at its `material`: its notice covers up to there (docs/decisions/0023).
#[must_use]
pub fn material(mut cursor: Cursor, seq: Sequence, now: Timestamp) -> Cursor {
    if cursor.notified <= cursor.last_seen {
        cursor.notified = if cursor.material > cursor.last_seen {
            cursor.material
        } else {
            seq
        };
    }
    cursor.material = cursor.material.max(seq);
    cursor.updated_at = now;
    cursor
}

/// Acknowledge: `last_seen := notified`; if something material came after the frozen watermark,
/// re-freeze at `material` and return exactly one follow-up notice. Returns `None` for the cursor
/// when there was nothing to acknowledge (nothing to write). `last_seen` never goes back. A
/// damaged row (torn, hand-edited: never written by these rules) is read as frozen at its
/// `material` when its `notified` is not above `last_seen` (so what was delivered is not handed
/// out again) or lies above `material` (so `last_seen` does not jump past changes still to
/// come) (docs/decisions/0023).
pub fn acknowledge(cursor: &Cursor, now: Timestamp) -> (Option<Cursor>, Option<Notice>) {
    if cursor.notified <= cursor.last_seen && !cursor.is_pending() {
        return (None, None);
    }
    let mut c = cursor.clone();
    // A damaged row is frozen at its `material`, as `material` reads it (a later event would
    // have frozen it there), or no higher than it.
    let frozen = if c.notified <= c.last_seen || c.notified > c.material {
        c.material
    } else {
        c.notified
    };
    c.last_seen = frozen.max(c.last_seen);
    c.notified = frozen;
    let mut follow_up = None;
    if c.material > c.notified {
        c.notified = c.material;
        follow_up = Some(Notice::of(&c));
    }
    c.updated_at = now;
    (Some(c), follow_up)
}

/// One target of an acknowledgement ([`crate::CursorStore::acknowledge`]): the target key and,
/// for a watcher's turn, the notice it read.
///
/// A turn reads its cursors, shows their notices, then acknowledges. Between the read and the
/// acknowledgement the cursor may be replaced: the watcher reset and watching the target again
/// (a spawn, a watch, a recording that names it), or the cursor re-pointed to another agent's
/// session of the key (decision 0008), with a new notice pending that the turn never showed.
/// An acknowledgement that names the notice it read ([`AckTarget::read`]) applies only while
/// the cursor still shows that notice: the same target agent and the same `last_seen` (which
/// the notice's text names), so the new one stays pending. One that names no notice
/// ([`AckTarget::any`], an operator's `ack`) acknowledges whatever is pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckTarget {
    /// The target whose notice is acknowledged.
    pub target: SessionKey,
    /// The notice that was read; `None` for whatever notice is pending.
    pub read: Option<ReadNotice>,
}

/// What an [`AckTarget`] names of the notice that was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadNotice {
    /// The agent of the session the notice was about.
    pub target_agent: AgentId,
    /// The sequence the notice said to reconcile from.
    pub last_seen: Sequence,
}

impl AckTarget {
    /// Acknowledges the target's pending notice, whichever it is.
    pub fn any(target: SessionKey) -> Self {
        Self { target, read: None }
    }

    /// Acknowledges `notice` only: nothing when the cursor on its target shows another.
    pub fn read(notice: &Notice) -> Self {
        Self {
            target: notice.target.clone(),
            read: Some(ReadNotice {
                target_agent: notice.target_agent.clone(),
                last_seen: notice.last_seen,
            }),
        }
    }

    /// Whether this acknowledgement applies to `cursor` (a cursor on its target).
    pub fn applies_to(&self, cursor: &Cursor) -> bool {
        self.read.as_ref().is_none_or(|read| {
            read.target_agent == cursor.target_agent && read.last_seen == cursor.last_seen
        })
    }

    /// [`acknowledge`] when this acknowledgement applies to `cursor`; else nothing to write and
    /// no follow-up.
    pub fn apply(&self, cursor: &Cursor, now: Timestamp) -> (Option<Cursor>, Option<Notice>) {
        if self.applies_to(cursor) {
            acknowledge(cursor, now)
        } else {
            (None, None)
        }
    }

    /// The targets of `list` in order, each target once (its first entry): what an
    /// acknowledgement applies its rule to, for the reason [`each_once`] gives.
    pub fn each_once(list: &[AckTarget]) -> impl Iterator<Item = &AckTarget> {
        let mut seen = std::collections::BTreeSet::new();
        list.iter().filter(move |a| seen.insert(&a.target))
    }
}

impl From<SessionKey> for AckTarget {
    fn from(target: SessionKey) -> Self {
        Self::any(target)
    }
}

/// The items of `list` in order, each once (its first occurrence): what a
/// [`refreeze`](crate::CursorStore::refreeze) call applies its rule to, and, by target, an
/// [`acknowledge`](crate::CursorStore::acknowledge) call ([`AckTarget::each_once`]). A target listed twice
/// in one acknowledgement was read once; applying [`acknowledge`] to it a second time would
/// acknowledge the follow-up notice the first pass just handed out, before anybody read it,
/// and the change behind that notice would never reach the watcher.
pub fn each_once<T: Ord>(list: &[T]) -> impl Iterator<Item = &T> {
    let mut seen = std::collections::BTreeSet::new();
    list.iter().filter(move |item| seen.insert(*item))
}

/// Start-up re-freeze of a pending cursor: `notified := material`, and its notice re-delivered.
/// Returns `None` when the cursor is not pending; else the cursor to write, `None` when it is
/// frozen at its notice already (nothing to write, decision 0002), and the notice.
pub fn refreeze(cursor: &Cursor, now: Timestamp) -> Option<(Option<Cursor>, Notice)> {
    if !cursor.is_pending() {
        return None;
    }
    if cursor.notified == cursor.material {
        return Some((None, Notice::of(cursor)));
    }
    let mut c = cursor.clone();
    c.notified = c.material;
    c.updated_at = now;
    let notice = Notice::of(&c);
    Some((Some(c), notice))
}

/// What recording an event does to cursors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CursorEffects {
    /// Cursors to insert or replace, keyed by (watcher, target).
    pub upserts: Vec<Cursor>,
    /// Notices to hand to delivery (one per watcher that became or stays pending).
    pub notices: Vec<Notice>,
}

/// The head of an event's ref once the event is recorded (not deduplicated): its sequence, the
/// store's clock `now`, and the pruned watermark of `previous` (zero for a ref without one), which
/// recording never moves.
pub fn head_after(previous: Option<&Head>, event: &Event, now: Timestamp) -> Head {
    Head {
        session: event.session_ref(),
        last_sequence: event.sequence,
        pruned_max_sequence: previous.map_or(Sequence::ZERO, |h| h.pruned_max_sequence),
        updated_at: now,
    }
}

/// The head of an event's ref once the event is recorded over a head row the store cannot read
/// (decision 0020): its sequence, the store's clock `now`, and a pruned watermark just below the
/// event. What the ref held before is unknown (events of it may have been pruned while the row
/// was unreadable, and its old watermark is lost with it), so a reconcile from any earlier
/// version is told of a history gap instead of being handed a history that looks whole.
pub fn head_over_unreadable(event: &Event, now: Timestamp) -> Head {
    Head {
        session: event.session_ref(),
        last_sequence: event.sequence,
        pruned_max_sequence: Sequence(event.sequence.0.saturating_sub(1)),
        updated_at: now,
    }
}

/// Why [`on_event`] writes nothing for a watcher an event names, when it writes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgnoredWatcher {
    /// The event is log-only: it notifies and seeds nobody.
    LogOnly,
    /// The watcher is the event's own session, which never watches itself.
    ItsOwnSession,
    /// The event notifies, and the watcher caused it (self-suppression: nothing is written for
    /// it). A seed is kept: a spawner is the actor of its own `child_spawned`.
    ItsOwnActor,
}

/// Whether [`on_event`] ignores `watcher` when an event of `class` on `session`, caused by
/// `actor_id`, names it; `None` when it is seeded or notified. The one rule the protocol
/// applies to named watchers, so that a caller (the CLI refusing a `--watcher` the event would
/// drop) asks it rather than repeating it.
pub fn ignored_watcher(
    class: KindClass,
    session: &SessionKey,
    actor_id: Option<&str>,
    watcher: &WatcherKey,
) -> Option<IgnoredWatcher> {
    match class {
        KindClass::LogOnly => Some(IgnoredWatcher::LogOnly),
        _ if watcher.session_key() == session => Some(IgnoredWatcher::ItsOwnSession),
        KindClass::Notify if actor_id == Some(watcher.as_str()) => {
            Some(IgnoredWatcher::ItsOwnActor)
        }
        KindClass::Notify | KindClass::Seed => None,
    }
}

/// The cursor effects of a freshly recorded (not deduplicated) event.
///
/// `existing` must hold every cursor whose target key is the event's key (of any agent); the
/// function picks those of the event's agent, plus the cursors of watchers the producer named.
///
/// - A log-only kind writes nothing.
/// - A seed kind (`child_spawned`) gives each named watcher other than the session itself a
///   cursor at the event's sequence, or keeps a pending one's sequences, making it explicit
///   ([`seed`]). The spawner is usually the event's actor too, and is seeded all the same.
/// - A notify kind moves the cursors on the event's ref. A named watcher without a cursor on
///   it (none, or one on another agent's session of the key) gets one starting at 0.
///   Self-caused events (the actor id is the watcher) write nothing for that watcher.
pub fn on_event(
    event: &Event,
    named: &[WatcherKey],
    existing: &[Cursor],
    now: Timestamp,
) -> CursorEffects {
    let target = event.session_ref();
    let mut out = CursorEffects::default();
    let find = |w: &WatcherKey| existing.iter().find(|c| &c.watcher == w);
    let class = event.kind.class();
    let ignored =
        |w: &WatcherKey| ignored_watcher(class, &event.session_key, event.actor_id.as_deref(), w);
    match class {
        KindClass::LogOnly => {}
        KindClass::Seed => {
            for w in each_once(named) {
                if ignored(w).is_some() {
                    continue;
                }
                if let Some(c) = seed(find(w), w, &target, event.sequence, now) {
                    out.upserts.push(c);
                }
            }
        }
        KindClass::Notify => {
            let mut watchers: Vec<&Cursor> = existing
                .iter()
                .filter(|c| c.target_agent == event.agent_id)
                .collect();
            watchers.sort_by(|a, b| a.watcher.cmp(&b.watcher));
            let mut fresh = Vec::new();
            for w in each_once(named) {
                // A watcher that caused the event is left out here, as the loop below leaves
                // out its existing cursor (self-suppression).
                if ignored(w).is_some() {
                    continue;
                }
                match find(w) {
                    Some(c) if c.target_agent == event.agent_id => {}
                    // A named watcher whose cursor points at another agent's same-named session
                    // is re-pointed at this one from scratch.
                    _ => fresh.push(Cursor::at(w.clone(), target.clone(), Sequence::ZERO, now)),
                }
            }
            let candidates = watchers.into_iter().cloned().chain(fresh);
            for c in candidates {
                if event.actor_id.as_deref() == Some(c.watcher.as_str()) {
                    continue; // self-suppression: a self-caused event writes nothing
                }
                let moved = material(c, event.sequence, now);
                // Pending after any event but on a row whose `last_seen` lies at or above the
                // event (hand-edited past the counter): its notice would only be dropped as
                // stale by the turn, after a wake for nothing.
                if moved.is_pending() {
                    out.notices.push(Notice::of(&moved));
                }
                out.upserts.push(moved);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ActorType, EventKind, NewEvent};

    fn w(s: &str) -> WatcherKey {
        WatcherKey::parse(s).unwrap()
    }
    fn r(s: &str) -> SessionRef {
        SessionRef::parse(s, "main").unwrap()
    }
    fn ev(kind: EventKind, seq: u64, actor: Option<&str>) -> Event {
        let mut e = NewEvent::new(r("agent:main:subagent:c1"), kind, ActorType::Human, "x");
        e.actor_id = actor.map(str::to_owned);
        e.into_event(Sequence(seq), Timestamp(5))
    }

    /// `ignored_watcher` answers what `on_event` does with each named watcher: for every kind
    /// class, a watcher that is the session, the actor, or neither, it is `None` exactly when
    /// `on_event` writes that watcher's cursor.
    #[test]
    fn ignored_watcher_is_what_on_event_does() {
        let session = r("agent:main:subagent:c1");
        for kind in EventKind::ALL {
            for named in [
                "agent:main:subagent:c1",
                "agent:main:main",
                "agent:main:other",
            ] {
                let watcher = w(named);
                let event = ev(kind.clone(), 7, Some("agent:main:main"));
                let written = on_event(&event, std::slice::from_ref(&watcher), &[], Timestamp(9))
                    .upserts
                    .iter()
                    .any(|c| c.watcher == watcher);
                let ignored = ignored_watcher(
                    kind.class(),
                    &session.session_key,
                    Some("agent:main:main"),
                    &watcher,
                );
                assert_eq!(
                    ignored.is_none(),
                    written,
                    "{kind} naming {named}: {ignored:?}"
                );
            }
        }
    }

    /// The manager's cursor on `c1`, watched at `seq`.
    fn watching_c1_from(seq: u64) -> Cursor {
        Cursor::at(
            w("agent:main:main"),
            r("agent:main:subagent:c1"),
            Sequence(seq),
            Timestamp(0),
        )
    }

    /// A row whose `last_seen` lies above the event (hand-edited past the store's counter) is
    /// moved as any row is, but hands out no notice: it is not pending, and its notice would be
    /// dropped as stale by the watcher's turn after a wake for nothing (found in review).
    #[test]
    fn a_row_seen_past_the_event_hands_out_no_notice() {
        let ahead = watching_c1_from(1000);
        let e = ev(EventKind::HumanDirectMessage, 12, None);
        let effects = on_event(&e, &[], std::slice::from_ref(&ahead), Timestamp(1));
        assert_eq!(effects.upserts.len(), 1, "the row is moved");
        assert!(!effects.upserts[0].is_pending());
        assert!(
            effects.notices.is_empty(),
            "no notice for a row not pending"
        );
        // A well-formed row is told as before.
        let behind = watching_c1_from(3);
        let effects = on_event(&e, &[], std::slice::from_ref(&behind), Timestamp(1));
        assert_eq!(effects.notices.len(), 1);
    }

    /// A row whose `notified` lies below its `last_seen` (torn or hand-edited) is read as
    /// frozen at its `material` when pending, else as one without a notice outstanding, and
    /// acknowledging never moves `last_seen` back (it handed out again what was delivered:
    /// "changesSince 4" after 10). Decision 0023.
    #[test]
    fn a_row_notified_below_last_seen_loses_no_notice_and_repeats_no_delivered_event() {
        let mut torn = watching_c1_from(10);
        torn.notified = Sequence(4);
        let seqs = |c: &Cursor| (c.last_seen.get(), c.notified.get(), c.material.get());
        assert_eq!(
            acknowledge(&torn, Timestamp(1)),
            (None, None),
            "nothing pending"
        );
        let moved = material(torn.clone(), Sequence(12), Timestamp(1));
        assert_eq!(seqs(&moved), (10, 12, 12), "frozen at the new event");
        let (acked, follow_up) = acknowledge(&moved, Timestamp(2));
        assert_eq!(seqs(&acked.expect("written")), (12, 12, 12));
        assert_eq!(follow_up, None);

        // Pending already (the turn is shown "changesSince 10" and reads up to 12): read as
        // frozen at 12, so its acknowledgement hands out nothing again ...
        torn.material = Sequence(12);
        let (acked, follow_up) = acknowledge(&torn, Timestamp(2));
        assert_eq!(seqs(&acked.expect("written")), (12, 12, 12));
        assert_eq!(follow_up, None, "10..=12 were read");
        // ... and an event after the turn read is told in a follow-up from 12, as for a
        // well-formed row.
        let later = material(torn, Sequence(14), Timestamp(2));
        assert_eq!(seqs(&later), (10, 12, 14));
        let (acked, follow_up) = acknowledge(&later, Timestamp(3));
        assert_eq!(seqs(&acked.expect("written")), (12, 14, 14));
        assert_eq!(follow_up.expect("a follow-up").last_seen, Sequence(12));

        // `notified` equal to `last_seen` below `material` (10, 10, 12): the same. Its notice
        // ("changesSince 10") read and acknowledged is not handed out again, and a change
        // between the read and the acknowledgement is told.
        let mut level = watching_c1_from(10);
        level.material = Sequence(12);
        let (acked, follow_up) = acknowledge(&level, Timestamp(1));
        assert_eq!(seqs(&acked.expect("written")), (12, 12, 12));
        assert_eq!(follow_up, None, "10..=12 were read");
        let later = material(level, Sequence(14), Timestamp(2));
        assert_eq!(seqs(&later), (10, 12, 14));
        let (_, follow_up) = acknowledge(&later, Timestamp(3));
        assert_eq!(follow_up.expect("a follow-up").last_seen, Sequence(12));

        // `notified` above `material` (5, 1000, 7), as if past the head: acknowledging does not
        // move `last_seen` past changes still to come, which are told.
        let mut high = watching_c1_from(5);
        (high.notified, high.material) = (Sequence(1000), Sequence(7));
        let (acked, _) = acknowledge(&high, Timestamp(1));
        let acked = acked.expect("written");
        assert_eq!(seqs(&acked), (7, 7, 7));
        let next = material(acked, Sequence(51), Timestamp(2));
        assert!(next.is_pending(), "{:?}", seqs(&next));
        assert_eq!(Notice::of(&next).last_seen, Sequence(7));

        // `last_seen` above `material`, `notified` above both (10, 12, 8): not pending, but a
        // notice is outstanding; acknowledging it keeps `last_seen` at 10, so 9 and 10 are not
        // handed out again. Nothing tested such a row: `last_seen := frozen`, and the early
        // return without its `notified` test, passed every test (review, stop 58).
        let mut above = watching_c1_from(10);
        (above.notified, above.material) = (Sequence(12), Sequence(8));
        let (acked, follow_up) = acknowledge(&above, Timestamp(1));
        let acked = acked.expect("the outstanding notice is taken");
        assert_eq!(acked.last_seen, Sequence(10), "{:?}", seqs(&acked));
        assert!(!acked.is_pending(), "{:?}", seqs(&acked));
        assert_eq!(follow_up, None);
    }

    /// An ambient cursor (OpenClaw's) hands out queue-only notices, keeps its provenance
    /// through material events, acknowledgements and re-freezes, and is made explicit by an explicit watch
    /// or a spawn, whose pending notice stays; an explicit cursor is left alone by both.
    #[test]
    fn an_ambient_cursor_is_queue_only_until_a_watch_or_a_spawn_makes_it_explicit() {
        let target = r("agent:main:subagent:c1");
        let mut ambient = Cursor::at(
            w("agent:main:main"),
            target.clone(),
            Sequence(1),
            Timestamp(0),
        );
        ambient.provenance = WatchProvenance::AmbientGroup;
        let moved = material(ambient.clone(), Sequence(2), Timestamp(1));
        assert_eq!(moved.provenance, WatchProvenance::AmbientGroup);
        assert!(Notice::of(&moved).queue_only);
        let (acked, none) = acknowledge(
            &material(moved.clone(), Sequence(3), Timestamp(2)),
            Timestamp(3),
        );
        let follow = none.expect("a follow-up for the change after the notice");
        assert!(follow.queue_only);
        assert_eq!(
            acked.expect("written").provenance,
            WatchProvenance::AmbientGroup
        );
        // The start-up sweep and a pick-up re-freeze it: still queue-only.
        let (refrozen, notice) = refreeze(
            &material(moved.clone(), Sequence(3), Timestamp(2)),
            Timestamp(3),
        )
        .expect("pending");
        assert_eq!(
            refrozen.expect("moved: written").provenance,
            WatchProvenance::AmbientGroup
        );
        assert!(notice.queue_only);

        let (watched, write) = watch(
            Some(&moved),
            &moved.watcher,
            &target,
            Sequence(9),
            Timestamp(4),
        );
        assert!(write, "the upgrade is written");
        assert_eq!(watched.provenance, WatchProvenance::Explicit);
        // What `watch_makes_explicit` answers: this upgrade; not the watch of an explicit
        // cursor, nor one that replaces the cursor (another agent's session of the key).
        assert!(watch_makes_explicit(&moved, &target));
        assert!(!watch_makes_explicit(&watched, &target));
        let other = SessionRef::parse(target.session_key.as_str(), "ops").expect("ref");
        assert!(!watch_makes_explicit(&moved, &other));
        // What `seed_makes_explicit` answers (as `seed` writes it: below): the cursor a
        // re-spawn keeps, made explicit; nothing for an explicit cursor, one with no pending
        // notice, or one on another agent's session of the key (which the seed replaces).
        assert_eq!(
            seed_makes_explicit(&moved, &target).map(|c| c.provenance),
            Some(WatchProvenance::Explicit)
        );
        assert_eq!(seed_makes_explicit(&watched, &target), None);
        assert_eq!(seed_makes_explicit(&moved, &other), None);
        assert_eq!(seed_makes_explicit(&ambient, &target), None, "not pending");
        let (replaced, _) = watch(
            Some(&moved),
            &moved.watcher,
            &other,
            Sequence(9),
            Timestamp(4),
        );
        assert_eq!(replaced.last_seen, Sequence(9), "replaced, not kept");
        assert_eq!(
            (watched.last_seen, watched.notified, watched.material),
            (moved.last_seen, moved.notified, moved.material),
            "the pending notice stays"
        );
        assert!(!Notice::of(&watched).queue_only);
        assert_eq!(
            watched.updated_at, moved.updated_at,
            "updated within a day: kept"
        );
        // An upgrade of a cursor not updated for a day refreshes it too (decision 0018).
        let later = moved.updated_at.plus_ms(WATCH_REFRESH_MS);
        let (upgraded, _) = watch(Some(&moved), &moved.watcher, &target, Sequence(9), later);
        assert_eq!(
            (upgraded.provenance, upgraded.updated_at),
            (WatchProvenance::Explicit, later)
        );
        // The JSON says so only when it is not explicit, so that it is unchanged otherwise.
        assert_eq!(json(&moved)["provenance"], "ambient-group");
        assert_eq!(json(&Notice::of(&moved))["queueOnly"], true);
        assert!(json(&watched).get("provenance").is_none());
        assert!(json(&Notice::of(&watched)).get("queueOnly").is_none());
        let seeded = seed(
            Some(&moved),
            &moved.watcher,
            &target,
            Sequence(9),
            Timestamp(4),
        )
        .expect("the upgrade is written");
        assert_eq!(seed_makes_explicit(&moved, &target).as_ref(), Some(&seeded));
        assert_eq!(seeded.provenance, WatchProvenance::Explicit);
        assert_eq!(seeded.notified, moved.notified, "the pending notice stays");

        let explicit_pending = Cursor {
            provenance: WatchProvenance::Explicit,
            ..moved
        };
        assert_eq!(
            watch(
                Some(&explicit_pending),
                &explicit_pending.watcher,
                &target,
                Sequence(9),
                Timestamp(4)
            ),
            (explicit_pending.clone(), false)
        );
        assert_eq!(
            seed(
                Some(&explicit_pending),
                &explicit_pending.watcher,
                &target,
                Sequence(9),
                Timestamp(4)
            ),
            None
        );
    }

    fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
        serde_json::to_value(v).expect("serializes")
    }

    #[test]
    fn each_once_keeps_the_first_of_each_in_order() {
        let got: Vec<&u8> = each_once(&[3, 1, 3, 2, 1, 3]).collect();
        assert_eq!(got, [&3, &1, &2]);
        assert_eq!(each_once::<u8>(&[]).count(), 0);
    }

    #[test]
    fn a_recorded_event_moves_the_head_and_keeps_the_watermark() {
        let first = head_after(
            None,
            &ev(EventKind::HumanDirectMessage, 3, None),
            Timestamp(7),
        );
        assert_eq!(first.session, r("agent:main:subagent:c1"));
        assert_eq!(first.last_sequence, Sequence(3));
        assert_eq!(first.pruned_max_sequence, Sequence::ZERO);
        assert_eq!(first.updated_at, Timestamp(7));
        let pruned = crate::retention::stamp(&first, Sequence(2), Timestamp(7));
        let next = head_after(
            Some(&pruned),
            &ev(EventKind::HumanDirectMessage, 9, None),
            Timestamp(8),
        );
        assert_eq!(
            (
                next.last_sequence,
                next.pruned_max_sequence,
                next.updated_at
            ),
            (Sequence(9), Sequence(2), Timestamp(8))
        );
    }

    #[test]
    fn notice_text_and_context_key_match_openclaw() {
        let t = SessionKey::new("agent:main:subagent:c1").unwrap();
        assert_eq!(
            notice_text(&t, Sequence(1)),
            "Session \"agent:main:subagent:c1\" changed (other actor). Reconcile before acting: session_status sessionKey \"agent:main:subagent:c1\" changesSince 1."
        );
        let k = context_key(&t);
        assert_eq!(
            k,
            "session-state:6167656e743a6d61696e3a7375626167656e743a6331"
        );
        assert_eq!(decode_context_key(&k).unwrap(), t);
    }

    /// A context key is refused unless it is exactly ours; an empty target is refused as such,
    /// and a key that merely holds `session-state:` is another producer's, a line a turn reads
    /// as it is. (What the mutations did: `contains` for `starts_with`, such a line taken for a
    /// notice, never evicted from a full queue and dropped by a reset; and with the empty check
    /// removed, an empty target refused as "not a valid session key"; review of stop 65, CO16
    /// and CO14.)
    #[test]
    fn context_key_decode_is_strict() {
        for bad in [
            "session-state:",
            "session-state:6",
            "session-state:6G",
            "session-state:6A",
            // A whole key's digits and one more (review, stop 58: without the odd-length
            // check the key decoded to the target).
            "session-state:6167656e743a6d61696e3a7375626167656e743a63316",
            "session-state:ff",
            "other:61",
            "session-state:00",
        ] {
            assert!(decode_context_key(bad).is_err(), "{bad}");
        }
        let unicode = SessionKey::new("agent:main:café").unwrap();
        assert_eq!(decode_context_key(&context_key(&unicode)).unwrap(), unicode);
        match decode_context_key("session-state:") {
            Err(ValidationError::ContextKey { reason, .. }) => {
                assert_eq!(reason, "empty target");
            }
            other => panic!("an empty target: {other:?}"),
        }
        let other = "cron:session-state:61";
        assert!(!is_session_state_context_key(other), "{other}");
        assert_eq!(
            classify_line("Reminder", Some(other), &[]),
            DrainedLine::Other,
            "{other}"
        );
    }

    /// Every context key decodes back to its target, whatever hex digits its bytes make: a
    /// target whose key holds a `0` digit (`p` is `70`, `0` is `30`: `agent:ops:main`, a
    /// subagent `c10`, `o` is `6f`) is acknowledged by its notice's key like any other. (What
    /// the mutations did: `b'1'..=b'9'` for `b'0'..=b'9'`, or `b'a'..=b'e'` for
    /// `b'a'..=b'f'`, such a key refused as "not lowercase hex", its drained notice read as
    /// malformed and never acknowledged; review of stop 70, PR06 and PR43.)
    #[test]
    fn a_context_key_with_every_hex_digit_decodes_to_its_target() {
        let mut digits = std::collections::BTreeSet::new();
        for key in [
            "agent:ops:main",
            "agent:main:subagent:c10",
            "agent:main:run-0123456789:abcdefghijklmnopqrstuvwxyz",
        ] {
            let target = SessionKey::new(key).unwrap();
            let k = context_key(&target);
            digits.extend(k[CONTEXT_KEY_PREFIX.len()..].chars());
            assert_eq!(decode_context_key(&k), Ok(target.clone()), "{key}");
            let n = Notice {
                watcher: w("agent:main:main"),
                target: target.clone(),
                target_agent: AgentId::new("ops").unwrap(),
                last_seen: Sequence(1),
                queue_only: false,
            };
            assert_eq!(
                classify_line(&n.text(), Some(&k), std::slice::from_ref(&n)),
                DrainedLine::Current(0),
                "{key}"
            );
        }
        assert_eq!(digits.len(), 16, "every hex digit: {digits:?}");
    }

    #[test]
    fn material_freezes_once_then_acknowledge_reopens_exactly_one() {
        let c = Cursor::at(
            w("agent:main:main"),
            r("agent:main:subagent:c1"),
            Sequence(1),
            Timestamp(0),
        );
        let c = material(c, Sequence(2), Timestamp(1));
        assert_eq!(
            (c.last_seen, c.notified, c.material),
            (Sequence(1), Sequence(2), Sequence(2))
        );
        let c = material(c, Sequence(3), Timestamp(1));
        assert_eq!(
            (c.last_seen, c.notified, c.material),
            (Sequence(1), Sequence(2), Sequence(3))
        );
        assert_eq!(Notice::of(&c).last_seen, Sequence(1));
        let (c, follow) = acknowledge(&c, Timestamp(2));
        let c = c.unwrap();
        assert_eq!(
            (c.last_seen, c.notified, c.material),
            (Sequence(2), Sequence(3), Sequence(3))
        );
        assert_eq!(follow.unwrap().last_seen, Sequence(2));
        let (c, follow) = acknowledge(&c, Timestamp(3));
        let c = c.unwrap();
        assert_eq!(
            (c.last_seen, c.notified, c.material),
            (Sequence(3), Sequence(3), Sequence(3))
        );
        assert!(follow.is_none());
        assert_eq!(acknowledge(&c, Timestamp(4)), (None, None));
    }

    #[test]
    fn seed_keeps_pending_and_watch_keeps_existing() {
        let t = r("agent:main:subagent:c1");
        let pending = material(
            Cursor::at(w("agent:main:main"), t.clone(), Sequence(1), Timestamp(0)),
            Sequence(4),
            Timestamp(0),
        );
        assert!(
            seed(
                Some(&pending),
                &pending.watcher,
                &t,
                Sequence(9),
                Timestamp(1)
            )
            .is_none()
        );
        let quiet = Cursor::at(w("agent:main:main"), t.clone(), Sequence(1), Timestamp(0));
        let seeded = seed(Some(&quiet), &quiet.watcher, &t, Sequence(9), Timestamp(1)).unwrap();
        assert_eq!(seeded.last_seen, Sequence(9));
        assert_eq!(
            watch(Some(&quiet), &quiet.watcher, &t, Sequence(9), Timestamp(1)),
            (quiet.clone(), false)
        );
        let (fresh, write) = watch(None, &quiet.watcher, &t, Sequence(9), Timestamp(1));
        assert!(write);
        assert_eq!(fresh.material, Sequence(9));
        // Another agent's session of the same key: the cursor moves there, at its head
        // (decision 0008), dropping the pending notice about the old one.
        let ops = SessionRef::parse("agent:main:subagent:c1", "ops").unwrap();
        let (moved, write) = watch(
            Some(&pending),
            &pending.watcher,
            &ops,
            Sequence(9),
            Timestamp(2),
        );
        assert!(write);
        assert_eq!(moved.target_agent.as_str(), "ops");
        assert_eq!(
            (moved.last_seen, moved.notified, moved.material),
            (Sequence(9), Sequence(9), Sequence(9))
        );
    }

    #[test]
    fn a_drained_line_is_stale_only_when_well_formed_and_not_a_current_notice() {
        let t = r("agent:main:subagent:c1");
        let cursor = material(
            Cursor::at(w("agent:main:main"), t.clone(), Sequence(3), Timestamp(0)),
            Sequence(4),
            Timestamp(0),
        );
        let current = [Notice::of(&cursor)];
        let key = context_key(&t.session_key);
        let now = notice_text(&t.session_key, Sequence(3));
        let read = notice_text(&t.session_key, Sequence(1));
        let line =
            |text: &str, key: Option<&str>, current: &[Notice]| classify_line(text, key, current);
        assert_eq!(
            line(&now, Some(&key), &current),
            DrainedLine::Current(0),
            "the current notice"
        );
        assert_eq!(
            line(&read, Some(&key), &current),
            DrainedLine::Stale,
            "an older notice, already read"
        );
        assert_eq!(
            line(&now, Some(&key), &[]),
            DrainedLine::Stale,
            "its cursor is gone"
        );
        let other = context_key(&SessionKey::new("agent:main:subagent:c2").unwrap());
        assert_eq!(
            line(&now, Some(&other), &current),
            DrainedLine::Stale,
            "same text, another key"
        );
        assert_eq!(line("Reminder", None, &[]), DrainedLine::Other, "no key");
        assert_eq!(
            line("Reminder", Some("cron:daily"), &current),
            DrainedLine::Other,
            "another kind of key"
        );
        assert!(
            matches!(
                line(&read, Some("session-state:zz"), &current),
                DrainedLine::Malformed(_)
            ),
            "malformed key"
        );
    }

    #[test]
    fn on_event_self_suppression_and_named_watchers() {
        let main = w("agent:main:main");
        let existing = vec![Cursor::at(
            main.clone(),
            r("agent:main:subagent:c1"),
            Sequence(1),
            Timestamp(0),
        )];
        let fx = on_event(
            &ev(EventKind::GoalChanged, 5, Some("agent:main:main")),
            &[],
            &existing,
            Timestamp(1),
        );
        assert!(fx.upserts.is_empty() && fx.notices.is_empty());
        let fx = on_event(
            &ev(EventKind::Compacted, 5, None),
            std::slice::from_ref(&main),
            &existing,
            Timestamp(1),
        );
        assert_eq!(fx, CursorEffects::default());
        let other = w("agent:ops:main");
        let fx = on_event(
            &ev(EventKind::HumanDirectMessage, 5, Some("user")),
            std::slice::from_ref(&other),
            &existing,
            Timestamp(1),
        );
        assert_eq!(fx.upserts.len(), 2);
        let fresh = fx.upserts.iter().find(|c| c.watcher == other).unwrap();
        assert_eq!(
            (fresh.last_seen, fresh.notified, fresh.material),
            (Sequence(0), Sequence(5), Sequence(5))
        );
        assert_eq!(fx.notices.len(), 2);
    }

    #[test]
    fn refreeze_only_pending() {
        let c = Cursor::at(
            w("agent:main:main"),
            r("agent:main:x"),
            Sequence(1),
            Timestamp(0),
        );
        assert!(refreeze(&c, Timestamp(1)).is_none());
        let frozen = material(c, Sequence(3), Timestamp(0));
        // Frozen at its notice already: re-delivered, nothing to write (decision 0002).
        assert_eq!(
            refreeze(&frozen, Timestamp(2)),
            Some((None, Notice::of(&frozen)))
        );
        let mut p = frozen;
        p.material = Sequence(7);
        let (c, n) = refreeze(&p, Timestamp(2)).unwrap();
        let c = c.expect("moved: written");
        assert_eq!(
            (c.last_seen, c.notified, c.material, c.updated_at),
            (Sequence(1), Sequence(7), Sequence(7), Timestamp(2))
        );
        assert_eq!(n.last_seen, Sequence(1));
        // A row notified past its material (a hand edit, decision 0023) is torn: re-frozen,
        // it is written back to `notified := material` (DESIGN.md section 4), which repairs
        // it. (Left as it was passed every test: review of stop 60.)
        let mut torn = p;
        torn.notified = Sequence(1000);
        let (c, n) = refreeze(&torn, Timestamp(3)).unwrap();
        let c = c.expect("repaired: written");
        assert_eq!(
            (c.last_seen, c.notified, c.material),
            (Sequence(1), Sequence(7), Sequence(7))
        );
        assert_eq!(n.last_seen, Sequence(1));
    }

    #[test]
    fn check_watch_refusals() {
        let t = SessionKey::new("agent:main:x").unwrap();
        assert!(check_watch(&SessionKey::new("global").unwrap(), &t).is_err());
        assert!(matches!(
            check_watch(&t, &t),
            Err(ValidationError::SelfWatch { .. })
        ));
        assert!(check_watch(&SessionKey::new("agent:main:main").unwrap(), &t).is_ok());
    }

    /// Only a notice that is not queue-only, to a main session, wakes (decision 0015): a
    /// nested subagent's is read on its next turn, an ambient cursor's is queued. (Either
    /// condition enough, a mutation awareness-core's and store-memory's tests passed, woke
    /// both: review of stop 61.)
    #[test]
    fn only_an_explicit_notice_to_a_main_session_wakes() {
        let target = r("agent:main:subagent:c1");
        let pending = |watcher: &str| {
            material(
                Cursor::at(w(watcher), target.clone(), Sequence(1), Timestamp(0)),
                Sequence(2),
                Timestamp(0),
            )
        };
        let main = pending("agent:main:main");
        assert!(Notice::of(&main).wakes(), "explicit, main session");
        assert!(
            !Notice::of(&pending("agent:main:subagent:p")).wakes(),
            "a nested subagent is not woken"
        );
        let ambient = Cursor {
            provenance: WatchProvenance::AmbientGroup,
            ..main
        };
        assert!(
            !Notice::of(&ambient).wakes(),
            "an ambient cursor's notice is queue-only"
        );
    }

    /// A spawn that names its watcher twice writes that watcher's cursor once. (Each name
    /// written, a mutation awareness-core's and store-memory's tests passed, wrote it twice,
    /// which store-postgres's one upsert refuses, failing the recording: review of stop 61.)
    #[test]
    fn a_spawn_naming_a_watcher_twice_writes_its_cursor_once() {
        let main = w("agent:main:main");
        let fx = on_event(
            &ev(EventKind::ChildSpawned, 5, Some("agent:main:main")),
            &[main.clone(), main],
            &[],
            Timestamp(1),
        );
        assert_eq!(fx.upserts.len(), 1, "{fx:?}");
    }

    /// A head written over an unreadable row reports a gap below its event only: a reconcile
    /// from just below the event is whole (decision 0020). (The watermark at the event, a
    /// mutation awareness-core's and store-memory's tests passed, reported a gap there too:
    /// review of stop 61.)
    #[test]
    fn a_head_over_an_unreadable_row_gaps_only_below_its_event() {
        let h = head_over_unreadable(&ev(EventKind::HumanDirectMessage, 9, None), Timestamp(1));
        let page = |after| {
            crate::reconcile::build_page(
                Sequence(after),
                Some(&h),
                Some(Sequence(9)),
                Vec::new(),
                200,
            )
        };
        assert!(page(7).history_gap, "from below: a gap");
        assert!(!page(8).history_gap, "from just below the event: whole");
    }

    /// A named watcher that is both the event's session and its actor is ignored as the
    /// session first: `awareness record` refuses it as a self-watch. (The two reasons taken
    /// the other way round, a mutation every test passed, the refusal named the actor:
    /// review of stop 61.)
    #[test]
    fn a_watcher_that_is_the_session_and_its_actor_is_ignored_as_the_session() {
        let s = SessionKey::new("agent:main:main").unwrap();
        assert_eq!(
            ignored_watcher(
                KindClass::Notify,
                &s,
                Some("agent:main:main"),
                &w("agent:main:main")
            ),
            Some(IgnoredWatcher::ItsOwnSession)
        );
    }

    /// A material event never lowers a cursor's `material` (a row another writer left past
    /// the counter, decision 0023), nor writes `notified` above it. (The event's number taken
    /// as the material, a mutation every test passed, wrote a torn row there: review of stop
    /// 61.)
    #[test]
    fn a_material_event_never_lowers_material() {
        let mut c = Cursor::at(
            w("agent:main:main"),
            r("agent:main:subagent:c1"),
            Sequence(5),
            Timestamp(0),
        );
        c.material = Sequence(1000);
        let m = material(c, Sequence(12), Timestamp(1));
        assert_eq!(m.material, Sequence(1000));
        assert!(
            m.last_seen <= m.notified && m.notified <= m.material,
            "{m:?}"
        );
    }

    /// A notify event hands out its notices, and writes its cursors, in watcher order, however the
    /// store listed the cursors it read: a store whose rows come back in no set order
    /// (store-postgres's recording reads the key's cursors with no `ORDER BY`) answers a recording
    /// with the same notices in the same order as any other. (What the mutation did: the sort taken
    /// out, the notices of a recording, which `record --json` lists and the gateway delivers in
    /// turn, came in the order the store's rows lay; review of stop 63, K08.)
    #[test]
    fn a_notify_event_hands_out_its_notices_in_watcher_order() {
        let watching = |watcher: &str| {
            Cursor::at(
                w(watcher),
                r("agent:main:subagent:c1"),
                Sequence(1),
                Timestamp(0),
            )
        };
        let listed = [watching("agent:main:zed"), watching("agent:main:alpha")];
        let e = ev(EventKind::GoalChanged, 7, None);
        let effects = on_event(&e, &[], &listed, Timestamp(9));
        let order: Vec<&str> = effects.notices.iter().map(|n| n.watcher.as_str()).collect();
        assert_eq!(
            order,
            ["agent:main:alpha", "agent:main:zed"],
            "notices in watcher order"
        );
        let written: Vec<&str> = effects.upserts.iter().map(|c| c.watcher.as_str()).collect();
        assert_eq!(
            written,
            ["agent:main:alpha", "agent:main:zed"],
            "cursors in watcher order"
        );
    }

    /// A named watcher new to the session (no cursor on it yet) gets its notice after the
    /// watchers already on it, here also watcher order: `alpha` (watching) before `zed` (named).
    /// (What the mutation did: the new named watchers taken before the cursors read, the
    /// recording listed `zed`'s notice and cursor first, an order `record --json` shows and the
    /// gateway delivers in; review of stop 68, CP50.)
    #[test]
    fn a_named_watcher_new_to_the_session_comes_after_those_already_watching() {
        let listed = [Cursor::at(
            w("agent:main:alpha"),
            r("agent:main:subagent:c1"),
            Sequence(1),
            Timestamp(0),
        )];
        let e = ev(EventKind::GoalChanged, 7, None);
        let effects = on_event(&e, &[w("agent:main:zed")], &listed, Timestamp(9));
        let order: Vec<&str> = effects.notices.iter().map(|n| n.watcher.as_str()).collect();
        assert_eq!(
            order,
            ["agent:main:alpha", "agent:main:zed"],
            "the watching one's notice first"
        );
        let written: Vec<&str> = effects.upserts.iter().map(|c| c.watcher.as_str()).collect();
        assert_eq!(
            written,
            ["agent:main:alpha", "agent:main:zed"],
            "the watching one's cursor first"
        );
    }
}
