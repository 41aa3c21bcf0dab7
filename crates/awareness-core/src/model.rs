//! The data model: keys, sequences, events, heads and cursors.
//!
//! Values are parsed once at the boundary (see [`crate::validate`]) and trusted afterwards.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// One store-wide, strictly increasing event number. `0` means "nothing recorded".
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Sequence(pub u64);

impl Sequence {
    /// The "nothing recorded" sequence.
    pub const ZERO: Sequence = Sequence(0);

    /// The raw number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The next sequence (saturating).
    #[must_use]
    pub const fn next(self) -> Sequence {
        Sequence(self.0.saturating_add(1))
    }
}

impl fmt::Display for Sequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<u64> for Sequence {
    fn from(v: u64) -> Self {
        Sequence(v)
    }
}

/// Milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The time `secs` seconds after the Unix epoch (a chat platform's message time), in the
    /// milliseconds a `Timestamp` holds; saturating at the ends of `i64`.
    pub const fn from_unix_secs(secs: i64) -> Timestamp {
        Timestamp(secs.saturating_mul(1_000))
    }

    /// One hour in milliseconds.
    pub const HOUR_MS: i64 = 60 * 60 * 1000;
    /// One day in milliseconds.
    pub const DAY_MS: i64 = 24 * Self::HOUR_MS;

    /// The raw milliseconds.
    pub const fn millis(self) -> i64 {
        self.0
    }

    /// This instant moved back by `ms` milliseconds (saturating).
    #[must_use]
    pub const fn minus_ms(self, ms: i64) -> Timestamp {
        Timestamp(self.0.saturating_sub(ms))
    }

    /// This instant moved forward by `ms` milliseconds (saturating).
    #[must_use]
    pub const fn plus_ms(self, ms: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }

    /// The instant in UTC as `YYYY-MM-DD HH:MM:SS.mmmZ` (proleptic Gregorian), for people to
    /// read: the CLI's tables, the bench report.
    pub fn utc(self) -> String {
        let days = self.0.div_euclid(Self::DAY_MS);
        let rem = self.0.rem_euclid(Self::DAY_MS);
        let (y, m, d) = civil_from_days(days);
        format!(
            "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}Z",
            rem / Self::HOUR_MS,
            rem / 60_000 % 60,
            rem / 1_000 % 60,
            rem % 1_000
        )
    }

    /// The system clock, for callers that have no clock of their own.
    pub fn now() -> Timestamp {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Timestamp(ms)
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day) (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

macro_rules! string_newtype {
    ($(#[$m:meta])* $name:ident, $check:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Parses and validates the value.
            pub fn new(value: impl AsRef<str>) -> Result<Self, ValidationError> {
                let value = value.as_ref();
                $check(value)?;
                Ok(Self(Arc::from(value)))
            }

            /// The value as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = ValidationError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_newtype!(
    /// A session key such as `agent:main:subagent:child`, or a bare key such as `global`.
    SessionKey,
    |v| validate::key("session key", v)
);
string_newtype!(
    /// An agent id such as `main`: a key without `:` ([`validate::agent_id`]).
    AgentId,
    validate::agent_id
);

impl SessionKey {
    /// The agent id when the key is agent-qualified (`agent:<agentId>:<rest>` with non-empty
    /// parts), `None` for a bare key.
    pub fn agent_id(&self) -> Option<&str> {
        let rest = self.0.strip_prefix("agent:")?;
        let (agent, tail) = rest.split_once(':')?;
        if agent.is_empty() || tail.is_empty() {
            return None;
        }
        Some(agent)
    }

    /// Whether the key is agent-qualified and so may act as a watcher.
    pub fn is_agent_qualified(&self) -> bool {
        self.agent_id().is_some()
    }

    /// Whether this is a nested subagent session, which is not woken at once when a notice
    /// arrives (docs/decisions/0031): read as OpenClaw's `isSubagentSessionKey` reads a key.
    /// Its non-empty `:`-separated parts are taken; when there are three or more and the
    /// first is `agent`, the key is one when its third part is `subagent` (in any case) and a
    /// part follows (`agent:<agentId>:subagent:...`); otherwise when the key itself starts
    /// with `subagent:` (in any case). (Until stop 55 any key holding `:subagent:` was one, so
    /// the main session `agent:subagent:main` of an agent called `subagent` was never woken.)
    ///
    /// The key and its agent part are trimmed as JavaScript's `trim` trims: of white space and
    /// U+FEFF, which Rust's `trim` keeps.
    pub fn is_subagent(&self) -> bool {
        let key = js_trim(&self.0);
        let mut parts = key.split(':').filter(|p| !p.is_empty());
        match (parts.next(), parts.next(), parts.next()) {
            (Some("agent"), Some(agent), Some(third)) if !js_trim(agent).is_empty() => {
                third.eq_ignore_ascii_case("subagent") && parts.next().is_some()
            }
            _ => key
                .get(.."subagent:".len())
                .is_some_and(|head| head.eq_ignore_ascii_case("subagent:")),
        }
    }
}

/// `text` trimmed as JavaScript's `String.prototype.trim` trims it: of its white space (Unicode's
/// `Zs` and the ASCII spaces and breaks) and U+FEFF, not of U+0085, which Rust's `trim` trims
/// and JavaScript's keeps.
fn js_trim(text: &str) -> &str {
    text.trim_matches(|c: char| (c.is_whitespace() && c != '\u{85}') || c == '\u{FEFF}')
}

/// A session's identity for heads and events: the key together with its agent.
///
/// Under `session.scope = "global"` every agent has its own session called `global`, so the key
/// alone is not enough.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRef {
    /// The session key.
    pub session_key: SessionKey,
    /// The owning agent.
    pub agent_id: AgentId,
}

impl SessionRef {
    /// Whether this ref is the session that watches under its key: the key is agent-qualified
    /// and names this ref's agent. Deleting it deletes the cursors its key watches with
    /// ([`Cursor::removed_by_delete`]); deleting the same key under another agent does not.
    pub fn is_watcher(&self) -> bool {
        self.session_key.agent_id() == Some(self.agent_id.as_str())
    }

    /// Builds a ref from validated parts.
    pub fn new(session_key: SessionKey, agent_id: AgentId) -> Self {
        Self {
            session_key,
            agent_id,
        }
    }

    /// Parses both parts.
    pub fn parse(session_key: &str, agent_id: &str) -> Result<Self, ValidationError> {
        Ok(Self::new(
            SessionKey::new(session_key)?,
            AgentId::new(agent_id)?,
        ))
    }

    /// The ref of an agent-qualified key, whose agent id is taken from the key itself.
    pub fn from_qualified(session_key: SessionKey) -> Option<Self> {
        let agent = AgentId::new(session_key.agent_id()?).ok()?;
        Some(Self::new(session_key, agent))
    }
}

impl fmt::Display for SessionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (agent {})", self.session_key, self.agent_id)
    }
}

/// A session key that may watch others: agent-qualified by construction.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct WatcherKey(SessionKey);

impl WatcherKey {
    /// Accepts only agent-qualified keys.
    pub fn new(key: SessionKey) -> Result<Self, ValidationError> {
        if key.is_agent_qualified() {
            Ok(Self(key))
        } else {
            Err(ValidationError::NotAgentQualified {
                key: key.as_str().to_owned(),
            })
        }
    }

    /// Parses and checks a string.
    pub fn parse(value: &str) -> Result<Self, ValidationError> {
        Self::new(SessionKey::new(value)?)
    }

    /// The underlying session key.
    pub fn session_key(&self) -> &SessionKey {
        &self.0
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The watcher's agent id (always present).
    pub fn agent_id(&self) -> &str {
        self.0.agent_id().unwrap_or_default()
    }
}

impl fmt::Display for WatcherKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for WatcherKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let key = SessionKey::deserialize(d)?;
        WatcherKey::new(key).map_err(serde::de::Error::custom)
    }
}

/// How an event kind affects watchers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KindClass {
    /// Notifies the target's watchers.
    Notify,
    /// Moves the head only.
    LogOnly,
    /// Seeds the cursor of the watcher the producer names (the spawner).
    Seed,
}

/// The kind of a state-change event.
///
/// The nine kinds of DESIGN.md section 3, and [`EventKind::Other`]: a kind this version does
/// not know, read from a row another writer of the file left (a later OpenClaw adds kinds). It
/// is returned with its spelling, as OpenClaw returns an event, instead of failing every page
/// that holds it; it counts as log-only here, and it cannot be recorded
/// ([`NewEvent::validate`] refuses it). The enum is `#[non_exhaustive]`: a kind DESIGN.md adds
/// later becomes a variant, and a `match` outside this crate keeps a catch-all arm for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum EventKind {
    /// A human turn in a watched session.
    HumanDirectMessage,
    /// The session's goal changed.
    GoalChanged,
    /// An adopted session's upstream source disappeared.
    UpstreamMissing,
    /// A child session was spawned; seeds the spawner's cursor.
    ChildSpawned,
    /// A child run completed.
    RunCompleted,
    /// A child run failed, timed out or was cancelled.
    RunFailed,
    /// The session was compacted.
    Compacted,
    /// The session was adopted from an external catalog.
    Adopted,
    /// The session was created.
    Created,
    /// A kind this version does not know, with its stored spelling. Stores reading another
    /// writer's rows build it ([`EventKind::from_stored`], which gives one of the nine for
    /// their spellings); built by hand with one of the nine's spellings, it is not equal to
    /// that kind, and validation refuses it as an unknown kind.
    Other(String),
}

impl EventKind {
    /// Every kind, in declaration order.
    pub const ALL: [EventKind; 9] = [
        EventKind::HumanDirectMessage,
        EventKind::GoalChanged,
        EventKind::UpstreamMissing,
        EventKind::ChildSpawned,
        EventKind::RunCompleted,
        EventKind::RunFailed,
        EventKind::Compacted,
        EventKind::Adopted,
        EventKind::Created,
    ];

    /// The stored spelling (`human_direct_message`, ...).
    pub fn as_str(&self) -> &str {
        match self {
            EventKind::HumanDirectMessage => "human_direct_message",
            EventKind::GoalChanged => "goal_changed",
            EventKind::UpstreamMissing => "upstream_missing",
            EventKind::ChildSpawned => "child_spawned",
            EventKind::RunCompleted => "run_completed",
            EventKind::RunFailed => "run_failed",
            EventKind::Compacted => "compacted",
            EventKind::Adopted => "adopted",
            EventKind::Created => "created",
            EventKind::Other(spelling) => spelling,
        }
    }

    /// Parses the spelling of one of the nine kinds; any other is refused (what a producer
    /// may record).
    pub fn parse(value: &str) -> Result<Self, ValidationError> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == value)
            .ok_or_else(|| ValidationError::UnknownKind {
                value: value.to_owned(),
            })
    }

    /// The kind a stored row spells: one of the nine, else [`EventKind::Other`] (what a store
    /// reads).
    pub fn from_stored(value: &str) -> Self {
        Self::parse(value).unwrap_or_else(|_| EventKind::Other(value.to_owned()))
    }

    /// Whether it is one of the nine kinds this version knows.
    pub fn is_known(&self) -> bool {
        !matches!(self, EventKind::Other(_))
    }

    /// The notify / log-only / seed table of DESIGN.md section 3; a kind this version does not
    /// know is log-only (a store never records one, so it only ever meets it on a read).
    pub fn class(&self) -> KindClass {
        match self {
            EventKind::HumanDirectMessage | EventKind::GoalChanged | EventKind::UpstreamMissing => {
                KindClass::Notify
            }
            EventKind::ChildSpawned => KindClass::Seed,
            EventKind::RunCompleted
            | EventKind::RunFailed
            | EventKind::Compacted
            | EventKind::Adopted
            | EventKind::Created
            | EventKind::Other(_) => KindClass::LogOnly,
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Any string: a kind this version does not know becomes [`EventKind::Other`], which
/// [`NewEvent::validate`] refuses to record.
impl<'de> Deserialize<'de> for EventKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spelling = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(EventKind::from_stored(&spelling))
    }
}

/// Who caused an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorType {
    /// A person.
    Human,
    /// Another session (the actor id is its session key).
    Agent,
    /// The gateway itself.
    System,
}

impl ActorType {
    /// Every actor type.
    pub const ALL: [ActorType; 3] = [ActorType::Human, ActorType::Agent, ActorType::System];

    /// The stored spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            ActorType::Human => "human",
            ActorType::Agent => "agent",
            ActorType::System => "system",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(value: &str) -> Result<Self, ValidationError> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == value)
            .ok_or_else(|| ValidationError::UnknownActorType {
                value: value.to_owned(),
            })
    }
}

impl fmt::Display for ActorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A JSON object carried by an event.
pub type Payload = serde_json::Map<String, serde_json::Value>;

/// An event to record, before it has a sequence. Build it with [`NewEvent::new`] and the
/// `with_*` methods; stores validate it with [`NewEvent::validate`] before writing anything.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The session the event is about.
    pub session: SessionRef,
    /// The gateway's session id (an incarnation of the key), when known.
    pub session_id: Option<String>,
    /// What happened.
    pub kind: EventKind,
    /// Who did it.
    pub actor_type: ActorType,
    /// The actor's id; for an agent, the session key that acted.
    pub actor_id: Option<String>,
    /// The run involved, when any.
    pub run_id: Option<String>,
    /// When it happened according to the producer, in milliseconds since the Unix epoch
    /// ([`Timestamp::from_unix_secs`] converts seconds); clamped into `[now - 24 h, now]`.
    pub occurred_at: Option<Timestamp>,
    /// One line, at most 200 characters, no control characters.
    pub summary: String,
    /// A JSON object of at most 4 KiB.
    pub payload: Option<Payload>,
    /// Makes the record idempotent: a second record with the same key returns the first event.
    pub dedupe_key: Option<String>,
    /// Watchers the producer names (a spawner): seeded for a `Seed` kind, notified (and created
    /// when missing) for a `Notify` kind, ignored for a log-only kind.
    pub watchers: Vec<WatcherKey>,
}

impl NewEvent {
    /// A new event with the required fields.
    pub fn new(
        session: SessionRef,
        kind: EventKind,
        actor_type: ActorType,
        summary: impl Into<String>,
    ) -> Self {
        Self {
            session,
            session_id: None,
            kind,
            actor_type,
            actor_id: None,
            run_id: None,
            occurred_at: None,
            summary: summary.into(),
            payload: None,
            dedupe_key: None,
            watchers: Vec::new(),
        }
    }

    /// Sets the actor id.
    #[must_use]
    pub fn with_actor_id(mut self, id: impl Into<String>) -> Self {
        self.actor_id = Some(id.into());
        self
    }

    /// Sets the session id.
    #[must_use]
    pub fn with_session_id(mut self, id: impl Into<String>) -> Self {
        self.session_id = Some(id.into());
        self
    }

    /// Sets the run id.
    #[must_use]
    pub fn with_run_id(mut self, id: impl Into<String>) -> Self {
        self.run_id = Some(id.into());
        self
    }

    /// Sets the producer's time.
    #[must_use]
    pub fn with_occurred_at(mut self, at: Timestamp) -> Self {
        self.occurred_at = Some(at);
        self
    }

    /// Sets the payload.
    #[must_use]
    pub fn with_payload(mut self, payload: Payload) -> Self {
        self.payload = Some(payload);
        self
    }

    /// Sets the dedupe key.
    #[must_use]
    pub fn with_dedupe_key(mut self, key: impl Into<String>) -> Self {
        self.dedupe_key = Some(key.into());
        self
    }

    /// Names a watcher (the spawner, for a `child_spawned` event).
    #[must_use]
    pub fn with_watcher(mut self, watcher: WatcherKey) -> Self {
        self.watchers.push(watcher);
        self
    }

    /// Checks every rule of DESIGN.md section 3; stores call this before writing anything.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let EventKind::Other(value) = &self.kind {
            return Err(ValidationError::UnknownKind {
                value: value.clone(),
            });
        }
        validate::summary(&self.summary)?;
        if let Some(p) = &self.payload {
            validate::payload(p)?;
        }
        for (what, v) in [
            ("session id", &self.session_id),
            ("actor id", &self.actor_id),
            ("run id", &self.run_id),
        ] {
            if let Some(v) = v {
                validate::key(what, v)?;
            }
        }
        if let Some(k) = &self.dedupe_key {
            validate::dedupe_key(k)?;
        }
        // Distinct watchers are counted only when there are more names than the limit (a
        // recording names one or two).
        let named = if self.watchers.len() > validate::MAX_NAMED_WATCHERS {
            crate::protocol::each_once(&self.watchers).count()
        } else {
            self.watchers.len()
        };
        if named > validate::MAX_NAMED_WATCHERS {
            return Err(ValidationError::TooManyWatchers {
                count: named,
                max: validate::MAX_NAMED_WATCHERS,
            });
        }
        Ok(())
    }

    /// The event this becomes once it has a sequence and a clamped time.
    pub fn into_event(self, sequence: Sequence, now: Timestamp) -> Event {
        Event {
            sequence,
            session_key: self.session.session_key,
            session_id: self.session_id,
            agent_id: self.session.agent_id,
            kind: self.kind,
            actor_type: self.actor_type,
            actor_id: self.actor_id,
            run_id: self.run_id,
            occurred_at: validate::clamp_occurred_at(self.occurred_at, now),
            summary: self.summary,
            payload: self.payload,
            dedupe_key: self.dedupe_key,
        }
    }
}

/// A recorded event. Serializes to the camelCase JSON of DESIGN.md section 5 (absent options are
/// omitted; the dedupe key is stored but never returned).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Its store-wide sequence.
    pub sequence: Sequence,
    /// The session key.
    pub session_key: SessionKey,
    /// The session id, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The owning agent.
    pub agent_id: AgentId,
    /// What happened.
    pub kind: EventKind,
    /// Who did it.
    pub actor_type: ActorType,
    /// The actor's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_id: Option<String>,
    /// The run involved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// When it happened (clamped).
    pub occurred_at: Timestamp,
    /// One line.
    pub summary: String,
    /// A JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Payload>,
    /// Stored, never returned in JSON.
    #[serde(skip)]
    pub dedupe_key: Option<String>,
}

impl Event {
    /// The ref the event belongs to.
    pub fn session_ref(&self) -> SessionRef {
        SessionRef::new(self.session_key.clone(), self.agent_id.clone())
    }
}

/// A session's head: the highest sequence ever recorded for it and its pruned watermark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Head {
    /// The session.
    pub session: SessionRef,
    /// `stateVersion`: never goes down, survives pruning.
    pub last_sequence: Sequence,
    /// The highest sequence of this ref that pruning deleted: pruning stamps it, and so does a
    /// recording over a head row that cannot be read, just below its event
    /// ([`crate::protocol::head_over_unreadable`], decision 0020), so that what the lost row
    /// covered reads as a history gap.
    pub pruned_max_sequence: Sequence,
    /// Local clock of the last change.
    pub updated_at: Timestamp,
}

/// A watcher's cursor on a target session.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cursor {
    /// The watching session.
    pub watcher: WatcherKey,
    /// The watched session's key.
    pub target: SessionKey,
    /// The watched session's agent (heads are read for this ref).
    pub target_agent: AgentId,
    /// Everything up to here has been delivered.
    pub last_seen: Sequence,
    /// The frozen watermark of the outstanding notice (`== last_seen`: none).
    pub notified: Sequence,
    /// The latest notify-eligible event on the target.
    pub material: Sequence,
    /// Local clock of the last change.
    pub updated_at: Timestamp,
    /// How the watch came to be (OpenClaw's `provenance` column). Every cursor this workspace
    /// makes is explicit; an ambient one is read from a file OpenClaw wrote, and its notices
    /// are queued without a wake ([`crate::Notice::queue_only`]). Left out of the JSON when
    /// explicit.
    #[serde(default, skip_serializing_if = "WatchProvenance::is_explicit")]
    pub provenance: WatchProvenance,
}

/// How a watch came to be, as OpenClaw's `session_watch_cursors.provenance` says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WatchProvenance {
    /// A spawn or an explicit watch (`sessions_send` with `watch: true`): its notices wake a
    /// main-session watcher (a nested subagent watcher is never woken, and a line already
    /// queued wakes nobody again).
    #[default]
    Explicit,
    /// OpenClaw's ambient watch of the sessions of a group conversation: its notices are queued
    /// for the watcher's next turn, without a wake. An explicit watch or a spawn on the same
    /// target makes it explicit.
    AmbientGroup,
}

impl WatchProvenance {
    /// The stored spelling (`explicit`, `ambient-group`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Explicit => "explicit",
            Self::AmbientGroup => "ambient-group",
        }
    }

    /// The provenance a stored spelling names; `None` for any other text.
    pub fn from_stored(value: &str) -> Option<Self> {
        match value {
            "explicit" => Some(Self::Explicit),
            "ambient-group" => Some(Self::AmbientGroup),
            _ => None,
        }
    }

    /// Whether it is [`WatchProvenance::Explicit`].
    #[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference
    pub fn is_explicit(&self) -> bool {
        *self == Self::Explicit
    }
}

impl Cursor {
    /// An explicit cursor with all three sequences at `at`.
    pub fn at(watcher: WatcherKey, target: SessionRef, at: Sequence, now: Timestamp) -> Self {
        Self {
            watcher,
            target: target.session_key,
            target_agent: target.agent_id,
            last_seen: at,
            notified: at,
            material: at,
            updated_at: now,
            provenance: WatchProvenance::Explicit,
        }
    }

    /// The target as a ref.
    pub fn target_ref(&self) -> SessionRef {
        SessionRef::new(self.target.clone(), self.target_agent.clone())
    }

    /// The cursor's key.
    pub fn key(&self) -> CursorKey {
        CursorKey {
            watcher: self.watcher.clone(),
            target: self.target.clone(),
        }
    }

    /// The protocol's invariant `last_seen <= notified <= material`; a cursor that breaks it is
    /// torn (a crash test or `doctor` reports it).
    pub fn is_well_formed(&self) -> bool {
        self.last_seen <= self.notified && self.notified <= self.material
    }

    /// Whether deleting `session` removes this cursor (DESIGN.md section 6: "cursors where S is
    /// watcher or target (of that agent)"): the deleted session is its watcher (whose key names
    /// its agent), or its target of that agent. Another agent's same-named target stays, and so
    /// does the watcher's cursor when the deleted ref names the watcher's key under another
    /// agent.
    pub fn removed_by_delete(&self, session: &SessionRef) -> bool {
        (session.is_watcher() && self.watcher.session_key() == &session.session_key)
            || self.follows(session)
    }

    /// Whether this cursor follows `session`: its key, of its agent. A cursor keyed by the
    /// same key but following another agent's session of it watches nothing of `session`: a
    /// recording there notifies it only when it names the watcher, and that recording, or a
    /// watch of `session`, moves it there from scratch, dropping a notice it held
    /// (docs/decisions/0008).
    pub fn follows(&self, session: &SessionRef) -> bool {
        self.target == session.session_key && self.target_agent == session.agent_id
    }

    /// A notice is pending when something material happened after `last_seen`.
    pub fn is_pending(&self) -> bool {
        Self::pending(self.last_seen, self.material)
    }

    /// [`Cursor::is_pending`] of a cursor with these sequences, for a store that filters rows
    /// before building cursors of them.
    pub fn pending(last_seen: Sequence, material: Sequence) -> bool {
        material > last_seen
    }

    /// The target agent to assume for a cursor row that does not store one (a row written by
    /// OpenClaw): the agent of an agent-qualified target key, else the watcher's agent.
    pub fn default_target_agent(watcher: &WatcherKey, target: &SessionKey) -> AgentId {
        let agent = target.agent_id().unwrap_or_else(|| watcher.agent_id());
        AgentId::new(agent).unwrap_or_else(|_| AgentId(Arc::from("main")))
    }
}

/// The primary key of a cursor.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CursorKey {
    /// The watcher.
    pub watcher: WatcherKey,
    /// The target key.
    pub target: SessionKey,
}

/// Which cursors to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CursorFilter {
    /// Only this watcher's cursors.
    pub watcher: Option<SessionKey>,
    /// Only cursors on this target key.
    pub target: Option<SessionKey>,
    /// Only cursors with a pending notice.
    pub pending_only: bool,
}

impl CursorFilter {
    /// Whether a cursor passes the filter.
    pub fn matches(&self, c: &Cursor) -> bool {
        self.watcher
            .as_ref()
            .is_none_or(|w| w == c.watcher.session_key())
            && self.target.as_ref().is_none_or(|t| *t == c.target)
            && (!self.pending_only || c.is_pending())
    }
}

/// Size and range of the event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogStats {
    /// Retained rows.
    pub rows: u64,
    /// Smallest retained sequence (0 when empty).
    pub min_sequence: Sequence,
    /// Largest retained sequence (0 when empty).
    pub max_sequence: Sequence,
}

/// The unit tests' plain event: a human message on `session`, recorded as `seq`.
#[cfg(test)]
pub(crate) fn test_message(session: &SessionRef, seq: u64) -> Arc<Event> {
    Arc::new(
        NewEvent::new(
            session.clone(),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "x",
        )
        .into_event(Sequence(seq), Timestamp(5)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A platform's seconds become milliseconds, saturating at the ends of `i64` as documented:
    /// a time in seconds too large for milliseconds is the latest time there is, which the
    /// clamp makes `now`, not a time wrapped round to before the epoch, which it made 24 h
    /// ago. (What the mutation did: `wrapping_mul`; review of stop 69, CQ02.)
    #[test]
    fn seconds_become_milliseconds_saturating() {
        assert_eq!(
            Timestamp::from_unix_secs(1_700_000_000),
            Timestamp(1_700_000_000_000)
        );
        assert_eq!(Timestamp::from_unix_secs(i64::MAX), Timestamp(i64::MAX));
        assert_eq!(Timestamp::from_unix_secs(i64::MIN), Timestamp(i64::MIN));
    }

    /// An event names at most 64 distinct watchers (README, decision 0021): the 65th is
    /// refused. (What the mutation did: a limit of 65, which the conformance suite, built on
    /// the constant, followed; review of stop 69, CQ11.)
    #[test]
    fn an_event_names_at_most_64_watchers() {
        let named = |n: usize| {
            (0..n).fold(
                NewEvent::new(
                    SessionRef::parse("agent:main:main", "main").unwrap(),
                    EventKind::HumanDirectMessage,
                    ActorType::Human,
                    "x",
                ),
                |e, i| e.with_watcher(WatcherKey::parse(&format!("agent:main:w{i}")).unwrap()),
            )
        };
        assert_eq!(named(64).validate(), Ok(()));
        assert_eq!(
            named(65).validate(),
            Err(ValidationError::TooManyWatchers { count: 65, max: 64 })
        );
    }

    /// Times render in the proleptic Gregorian calendar, before the epoch and before the year
    /// 1 too, the year counted down through 0. (What the mutation did: took the 400-year era
    /// by truncating division, so a time before `0000-03-01` showed 400 years late; review of
    /// stop 71, CA56.)
    #[test]
    fn utc_renders_civil_dates() {
        assert_eq!(Timestamp(0).utc(), "1970-01-01 00:00:00.000Z");
        assert_eq!(
            Timestamp(1_800_000_000_000).utc(),
            "2027-01-15 08:00:00.000Z"
        );
        // A leap day, and milliseconds.
        assert_eq!(Timestamp(951_782_400_123).utc(), "2000-02-29 00:00:00.123Z");
        // Before the epoch: the last millisecond of 1969.
        assert_eq!(Timestamp(-1).utc(), "1969-12-31 23:59:59.999Z");
        assert_eq!(
            Timestamp(-62_167_219_200_000).utc(),
            "0000-01-01 00:00:00.000Z",
            "the first millisecond of the year 0"
        );
        assert_eq!(
            Timestamp(-62_167_219_200_001).utc(),
            "-001-12-31 23:59:59.999Z",
            "the last millisecond of the year -1"
        );
    }

    /// Moving an instant back saturates at the start of `i64`, as documented, rather than
    /// wrapping round to the far future (a retention cutoff taken so would delete everything).
    /// (What the mutation did: `wrapping_sub`; review of stop 71, CA01.)
    #[test]
    fn moving_an_instant_back_saturates() {
        assert_eq!(Timestamp(0).minus_ms(i64::MAX), Timestamp(-i64::MAX));
        assert_eq!(
            Timestamp(-2).minus_ms(i64::MAX),
            Timestamp(i64::MIN),
            "saturated at the start of i64"
        );
    }

    /// A nested subagent is what OpenClaw's `isSubagentSessionKey` says is one (decision
    /// 0031): the part after the agent id (or a bare key) starts with `subagent:`, in any case,
    /// empty parts left out. Bug (review, stop 55): any key holding `:subagent:` was one, so
    /// `agent:subagent:main`, the main session of an agent called `subagent`, was never woken.
    /// (A bare key's prefix read in one case only passed every test: no caller asks of a bare
    /// key, which cannot watch; pinned to the doc all the same; review of stop 65, CM43.)
    #[test]
    fn nested_subagents_are_read_as_openclaw_reads_them() {
        for (key, nested) in [
            ("agent:main:subagent:child", true),
            ("agent:main:subagent:parent:subagent:child", true),
            ("agent:ops:SubAgent:child", true),
            ("subagent:child", true),
            ("SubAgent:x", true),
            ("SUBAGENT:child:y", true),
            ("agent:subagent:main", false),
            ("agent:subagent:telegram:direct:42", false),
            ("agent:main:telegram:subagent:x", false),
            ("agent:main:main", false),
            ("global", false),
            ("agent:main:sub", false),
            ("agent:main:ü", false),
            // OpenClaw leaves empty parts out before it reads the key.
            ("agent:main::subagent:x", true),
            ("agent:main:subagent:", false),
            ("agent:main:subagentx:y", false),
            // Trimmed as JavaScript trims: U+FEFF too, which Rust's `trim` keeps (review).
            ("\u{FEFF}subagent:x", true),
            ("\u{FEFF}agent:main:subagent:x", true),
            ("agent:\u{FEFF}:subagent:x", false),
            ("\u{3000}subagent:x", true),
        ] {
            let k = SessionKey::new(key).unwrap();
            assert_eq!(k.is_subagent(), nested, "{key}");
        }
    }

    #[test]
    fn agent_qualified_parsing() {
        let k = SessionKey::new("agent:main:subagent:child").unwrap();
        assert_eq!(k.agent_id(), Some("main"));
        assert!(k.is_subagent());
        for bare in [
            "global",
            "main",
            "agent:",
            "agent::x",
            "agent:main:",
            "agent:main",
        ] {
            let k = SessionKey::new(bare).unwrap();
            assert_eq!(k.agent_id(), None, "{bare}");
            assert!(WatcherKey::new(k).is_err(), "{bare}");
        }
        assert!(SessionKey::new("").is_err());
        assert_eq!(
            WatcherKey::parse("agent:ops:main").unwrap().agent_id(),
            "ops"
        );
    }

    /// `EventKind::ALL` holds the known kinds, each once, in declaration order: stores outside
    /// this crate (where the enum is non-exhaustive) give each kind of it a code or a spelling.
    /// This catches a misordered or repeated `ALL`, not a missing one: a variant added to the
    /// enum must get an arm here (the match is exhaustive in this crate), which reminds its
    /// author to place it in `ALL` too.
    #[test]
    fn all_holds_every_known_kind() {
        // Exhaustive here, in the defining crate: a new variant fails to compile until it is
        // placed.
        let index = |k: &EventKind| match k {
            EventKind::HumanDirectMessage => 0,
            EventKind::GoalChanged => 1,
            EventKind::UpstreamMissing => 2,
            EventKind::ChildSpawned => 3,
            EventKind::RunCompleted => 4,
            EventKind::RunFailed => 5,
            EventKind::Compacted => 6,
            EventKind::Adopted => 7,
            EventKind::Created => 8,
            EventKind::Other(_) => usize::MAX,
        };
        for (i, k) in EventKind::ALL.iter().enumerate() {
            assert_eq!(index(k), i, "{k}");
        }
    }

    /// An agent id holds no `:`, however it is made: the agent an agent-qualified key names
    /// ends at its first `:`, so a ref of `agent:a:b:x` under an agent `a:b` would say it is
    /// not the watcher whose key it holds.
    #[test]
    fn an_agent_id_holds_no_colon() {
        let refused = ValidationError::ColonInAgentId {
            value: "a:b".into(),
        };
        assert_eq!(AgentId::new("a:b"), Err(refused.clone()));
        assert_eq!("a:b".parse::<AgentId>(), Err(refused.clone()));
        assert_eq!(SessionRef::parse("agent:a:b:x", "a:b"), Err(refused));
        let json = serde_json::from_str::<AgentId>("\"a:b\"").unwrap_err();
        assert!(json.to_string().contains("contains ':'"), "{json}");
        // The rule is the agent id's alone: keys keep their colons.
        assert!(SessionKey::new("agent:a:b:x").is_ok());
        assert_eq!(AgentId::new("a-b").unwrap().as_str(), "a-b");
    }

    /// A bare key is never a watcher, parsed from text or not; a session ref needs both parts.
    #[test]
    fn a_watcher_is_agent_qualified_and_a_ref_has_both_parts() {
        for bare in ["global", "main"] {
            assert!(
                matches!(
                    WatcherKey::parse(bare),
                    Err(ValidationError::NotAgentQualified { key }) if key == bare
                ),
                "{bare}"
            );
        }
        assert!(WatcherKey::parse("").is_err());
        assert!(SessionRef::parse("", "main").is_err(), "an empty key");
        assert!(SessionRef::parse("x", "").is_err(), "an empty agent");
        assert!(SessionRef::parse("x", "main").is_ok());
    }

    /// A watcher read from JSON (a notice's, a cursor's) is agent-qualified, as one parsed from
    /// text is: a bare key is refused, and a notice for it is not read. (What the mutation did:
    /// any session key read as a watcher, a notice for `global` read back with an empty agent;
    /// review of stop 67, CY09.)
    #[test]
    fn a_watcher_read_from_json_is_agent_qualified() {
        let bare = serde_json::from_str::<WatcherKey>("\"global\"").unwrap_err();
        assert!(
            bare.to_string()
                .contains("is not an agent-qualified session key"),
            "{bare}"
        );
        let notice = serde_json::json!({
            "watcher": "global",
            "target": "agent:main:subagent:c",
            "targetAgent": "main",
            "lastSeen": 1,
        });
        assert!(
            serde_json::from_value::<crate::protocol::Notice>(notice).is_err(),
            "a notice for a bare key"
        );
        let watcher: WatcherKey = serde_json::from_str("\"agent:ops:main\"").unwrap();
        assert_eq!(watcher.agent_id(), "ops");
    }

    /// The dedupe key is kept on the event (a store stores it) but never in its JSON, which is
    /// all a caller of the protocol sees of it.
    #[test]
    fn an_events_json_never_carries_its_dedupe_key() {
        let ev = NewEvent::new(
            SessionRef::parse("agent:main:subagent:c1", "main").unwrap(),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "x",
        )
        .with_dedupe_key("secret-key")
        .into_event(Sequence(1), Timestamp(0));
        assert_eq!(ev.dedupe_key.as_deref(), Some("secret-key"));
        let json = serde_json::to_string(&ev).unwrap();
        assert!(!json.contains("secret-key"), "{json}");
        assert!(!json.contains("dedupeKey"), "{json}");
        let back: Event = serde_json::from_str(&json).unwrap();
        assert_eq!(back.dedupe_key, None, "nothing to read back either");
    }

    /// A kind this version does not know is read with its spelling, written back as it was,
    /// log-only, and refused when recorded.
    #[test]
    fn a_kind_this_version_does_not_know_is_read_but_never_recorded() {
        let k = EventKind::from_stored("session_reset");
        assert_eq!(k, EventKind::Other("session_reset".into()));
        assert!(!k.is_known());
        assert_eq!(k.as_str(), "session_reset");
        assert_eq!(k.class(), KindClass::LogOnly);
        assert_eq!(serde_json::to_value(&k).unwrap(), "session_reset");
        assert_eq!(
            serde_json::from_value::<EventKind>("session_reset".into()).unwrap(),
            k
        );
        assert!(matches!(
            EventKind::parse("session_reset"),
            Err(ValidationError::UnknownKind { .. })
        ));
        let e = NewEvent::new(
            SessionRef::parse("agent:main:main", "main").unwrap(),
            k,
            ActorType::System,
            "x",
        );
        assert_eq!(
            e.validate(),
            Err(ValidationError::UnknownKind {
                value: "session_reset".into()
            })
        );
    }

    /// Every kind's spelling, JSON and class; kinds and actor types spelled exactly as
    /// DESIGN.md section 3 spells them. (What the mutations did: compared the spellings in any
    /// ASCII case, so `awareness record --kind Human_Direct_Message` or `--actor-type Human` was
    /// recorded, and a stored row so spelled read as a known kind or actor; review of stop 71,
    /// CA08 and CA09.)
    #[test]
    fn kind_table() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::parse(k.as_str()).unwrap(), k);
            assert_eq!(
                serde_json::to_value(&k).unwrap(),
                serde_json::Value::String(k.as_str().into())
            );
            assert_eq!(EventKind::from_stored(k.as_str()), k, "a known spelling");
            assert_eq!(
                serde_json::from_value::<EventKind>(k.as_str().into()).unwrap(),
                k
            );
        }
        assert_eq!(EventKind::HumanDirectMessage.class(), KindClass::Notify);
        assert_eq!(EventKind::GoalChanged.class(), KindClass::Notify);
        assert_eq!(EventKind::UpstreamMissing.class(), KindClass::Notify);
        assert_eq!(EventKind::ChildSpawned.class(), KindClass::Seed);
        for k in [
            EventKind::RunCompleted,
            EventKind::RunFailed,
            EventKind::Compacted,
            EventKind::Adopted,
            EventKind::Created,
        ] {
            assert_eq!(k.class(), KindClass::LogOnly);
        }
        assert!(EventKind::parse("nope").is_err());
        assert!(ActorType::parse("robot").is_err());
        // Spelled in one case only: another is refused when recorded (`awareness record`), a
        // stored kind so spelled is one this version does not know, and a stored actor type
        // so spelled is damaged, as its JSON refuses it.
        assert!(
            matches!(
                EventKind::parse("Human_Direct_Message"),
                Err(ValidationError::UnknownKind { .. })
            ),
            "a kind in another case is refused"
        );
        assert_eq!(
            EventKind::from_stored("GOAL_CHANGED"),
            EventKind::Other("GOAL_CHANGED".into()),
            "a stored kind in another case is one this version does not know"
        );
        assert!(
            matches!(
                ActorType::parse("Human"),
                Err(ValidationError::UnknownActorType { .. })
            ),
            "an actor type in another case is refused"
        );
        assert!(
            serde_json::from_value::<ActorType>("Human".into()).is_err(),
            "as its JSON refuses it"
        );
    }

    #[test]
    fn event_json_is_camel_case_without_absent_fields() {
        let ev = NewEvent::new(
            SessionRef::parse("agent:main:subagent:c1", "main").unwrap(),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "human message via telegram",
        )
        .with_actor_id("user-1")
        .with_dedupe_key("dk")
        .into_event(Sequence(2), Timestamp(1_800_000_000_000));
        let json = serde_json::to_string(&ev).unwrap();
        assert_eq!(
            json,
            r#"{"sequence":2,"sessionKey":"agent:main:subagent:c1","agentId":"main","kind":"human_direct_message","actorType":"human","actorId":"user-1","occurredAt":1800000000000,"summary":"human message via telegram"}"#
        );
    }

    /// An event recorded without an actor id (a system's event) leaves `actorId` out of its
    /// JSON, as it does every other absent field, rather than writing it as `null`. (What the
    /// mutation did: `"actorId":null` in the JSON of every event without an actor id, which the
    /// test above, whose event has one, did not see; review of stop 67, CY01.)
    #[test]
    fn an_events_json_leaves_out_an_absent_actor_id() {
        let ev = NewEvent::new(
            SessionRef::parse("agent:main:main", "main").unwrap(),
            EventKind::GoalChanged,
            ActorType::System,
            "goal updated",
        )
        .into_event(Sequence(3), Timestamp(7));
        let json = serde_json::to_string(&ev).unwrap();
        assert_eq!(
            json,
            r#"{"sequence":3,"sessionKey":"agent:main:main","agentId":"main","kind":"goal_changed","actorType":"system","occurredAt":7,"summary":"goal updated"}"#
        );
        let back: Event = serde_json::from_str(&json).unwrap();
        assert_eq!(back, ev, "read back as it was");
    }

    #[test]
    fn delete_and_well_formed_predicates() {
        let w = WatcherKey::parse("agent:ops:main").unwrap();
        let c = Cursor::at(
            w,
            SessionRef::parse("global", "main").unwrap(),
            Sequence(3),
            Timestamp(0),
        );
        assert!(c.is_well_formed());
        assert!(c.removed_by_delete(&SessionRef::parse("global", "main").unwrap()));
        assert!(
            !c.removed_by_delete(&SessionRef::parse("global", "ops").unwrap()),
            "another agent's global"
        );
        assert!(
            c.removed_by_delete(&SessionRef::parse("agent:ops:main", "ops").unwrap()),
            "its watcher"
        );
        let mut torn = c.clone();
        torn.notified = Sequence(9);
        assert!(!torn.is_well_formed(), "notified above material");
        torn.material = Sequence(9);
        torn.last_seen = Sequence(10);
        assert!(!torn.is_well_formed(), "last_seen above notified");
    }

    /// A cursor follows its key's session of its own agent only, not another agent's session of
    /// the key, nor another key.
    #[test]
    fn a_cursor_follows_its_agents_session_of_its_key() {
        let w = WatcherKey::parse("agent:main:main").unwrap();
        let global = |agent: &str| SessionRef::parse("global", agent).unwrap();
        let c = Cursor::at(w, global("ops"), Sequence(3), Timestamp(1));
        assert!(c.follows(&global("ops")));
        assert!(!c.follows(&global("main")));
        assert!(!c.follows(&SessionRef::parse("agent:ops:main", "ops").unwrap()));
    }

    #[test]
    fn default_target_agent() {
        let w = WatcherKey::parse("agent:ops:main").unwrap();
        let t = SessionKey::new("agent:main:subagent:x").unwrap();
        assert_eq!(Cursor::default_target_agent(&w, &t).as_str(), "main");
        let g = SessionKey::new("global").unwrap();
        assert_eq!(Cursor::default_target_agent(&w, &g).as_str(), "ops");
    }
}
