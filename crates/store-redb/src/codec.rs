//! The compact binary encoding of an event row (the value of the `events` table).
//!
//! ```text
//! byte 0      format version (1)
//! byte 1      kind code        (fixed table below, independent of enum order)
//! byte 2      actor type code
//! byte 3      presence flags   (session id, actor id, run id, payload, dedupe key)
//! bytes 4..12 occurredAt, i64 little endian
//! then        session key, agent id, [session id], [actor id], [run id], summary,
//!             [payload as JSON text], [dedupe key]; each a u32 LE length and UTF-8 bytes
//! ```
//!
//! The sequence is the row's key and is not repeated in the value.

use awareness_core::{
    ActorType, AgentId, Event, EventKind, Payload, Sequence, SessionKey, SessionRef, StoreError,
    Timestamp,
};

const VERSION: u8 = 1;
const HEADER: usize = 12;

const HAS_SESSION_ID: u8 = 1;
const HAS_ACTOR_ID: u8 = 1 << 1;
const HAS_RUN_ID: u8 = 1 << 2;
const HAS_PAYLOAD: u8 = 1 << 3;
const HAS_DEDUPE: u8 = 1 << 4;
/// Every presence flag this format knows; a row with another bit set is not one of its rows.
const KNOWN_FLAGS: u8 = HAS_SESSION_ID | HAS_ACTOR_ID | HAS_RUN_ID | HAS_PAYLOAD | HAS_DEDUPE;

/// The code of one of the nine kinds; `None` for [`EventKind::Other`], which validation keeps
/// from ever being recorded (store-redb writes only what it records; it reads a later
/// version's kinds as [`EventKind::Other`], see [`stored_kind`]).
fn kind_code(kind: &EventKind) -> Option<u8> {
    Some(match kind {
        EventKind::HumanDirectMessage => 1,
        EventKind::GoalChanged => 2,
        EventKind::UpstreamMissing => 3,
        EventKind::ChildSpawned => 4,
        EventKind::RunCompleted => 5,
        EventKind::RunFailed => 6,
        EventKind::Compacted => 7,
        EventKind::Adopted => 8,
        EventKind::Created => 9,
        // `EventKind` is non-exhaustive: a kind added to core has no code until it is given
        // one here (a test checks every kind of `EventKind::ALL` has one).
        _ => return None,
    })
}

fn kind_of(code: u8) -> Option<EventKind> {
    EventKind::ALL
        .into_iter()
        .find(|k| kind_code(k) == Some(code))
}

/// The codes after the nine: a later version that adds a kind gives it one of them.
const LATER_KINDS: std::ops::RangeInclusive<u8> = 10..=u8::MAX;

/// The kind of a stored code: one of the nine, else, for a code a later version may have
/// given a kind of its own, [`EventKind::Other`] spelled `kind code N` (read as an unknown
/// kind, log-only, as store-sqlite reads a kind it does not know), so that a rollback to this
/// version still reads the sessions that hold such events; `None` for code 0, which no kind
/// ever had.
fn stored_kind(code: u8) -> Option<EventKind> {
    kind_of(code).or_else(|| {
        LATER_KINDS
            .contains(&code)
            .then(|| EventKind::Other(format!("kind code {code}")))
    })
}

fn actor_code(actor: ActorType) -> u8 {
    match actor {
        ActorType::Human => 1,
        ActorType::Agent => 2,
        ActorType::System => 3,
    }
}

fn actor_of(code: u8) -> Option<ActorType> {
    ActorType::ALL.into_iter().find(|a| actor_code(*a) == code)
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Every stored string is bounded far below 4 GiB by validation (keys, a 200-character
    // summary, a 4 KiB payload).
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Encodes an event row.
pub(crate) fn encode(e: &Event) -> Result<Vec<u8>, StoreError> {
    let kind = kind_code(&e.kind).ok_or_else(|| {
        StoreError::from(awareness_core::ValidationError::UnknownKind {
            value: e.kind.as_str().to_owned(),
        })
    })?;
    let payload = e
        .payload
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|err| StoreError::backend("encode the event payload", err))?;
    let mut flags = 0;
    for (present, bit) in [
        (e.session_id.is_some(), HAS_SESSION_ID),
        (e.actor_id.is_some(), HAS_ACTOR_ID),
        (e.run_id.is_some(), HAS_RUN_ID),
        (payload.is_some(), HAS_PAYLOAD),
        (e.dedupe_key.is_some(), HAS_DEDUPE),
    ] {
        if present {
            flags |= bit;
        }
    }
    let mut out = Vec::with_capacity(
        HEADER
            + 32
            + e.session_key.as_str().len()
            + e.summary.len()
            + payload.as_ref().map_or(0, String::len),
    );
    out.extend_from_slice(&[VERSION, kind, actor_code(e.actor_type), flags]);
    out.extend_from_slice(&e.occurred_at.millis().to_le_bytes());
    put_str(&mut out, e.session_key.as_str());
    put_str(&mut out, e.agent_id.as_str());
    for s in [&e.session_id, &e.actor_id, &e.run_id]
        .into_iter()
        .flatten()
    {
        put_str(&mut out, s);
    }
    put_str(&mut out, &e.summary);
    for s in [&payload, &e.dedupe_key].into_iter().flatten() {
        put_str(&mut out, s);
    }
    Ok(out)
}

/// The fields of a row that bookkeeping needs, read without building an [`Event`].
pub(crate) struct RowMeta<'a> {
    pub session_key: &'a str,
    pub agent_id: &'a str,
    pub dedupe_key: Option<&'a str>,
}

/// Reads `occurredAt` alone (a fixed offset), for pruning by age.
pub(crate) fn occurred_at(seq: u64, data: &[u8]) -> Result<i64, StoreError> {
    match data.get(..HEADER) {
        Some(h) if h[0] == VERSION => Ok(i64::from_le_bytes(
            h[4..12].try_into().expect("eight bytes"),
        )),
        _ => Err(StoreError::corrupt(format!("event row {seq}: bad header"))),
    }
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    seq: u64,
}

impl<'a> Reader<'a> {
    fn corrupt(&self, what: &str) -> StoreError {
        StoreError::corrupt(format!("event row {}: {what}", self.seq))
    }

    fn str(&mut self) -> Result<&'a str, StoreError> {
        let bytes = self.bytes()?;
        self.utf8(bytes)
    }

    fn utf8(&self, bytes: &'a [u8]) -> Result<&'a str, StoreError> {
        std::str::from_utf8(bytes).map_err(|_| self.corrupt("a field is not UTF-8"))
    }

    /// A field's bytes, not yet checked to be UTF-8.
    fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        let len_end = self.pos + 4;
        let len_bytes = self
            .data
            .get(self.pos..len_end)
            .ok_or_else(|| self.corrupt("truncated"))?;
        // A damaged length may not fit the address space (a 32-bit target): truncated too.
        let end = usize::try_from(u32::from_le_bytes(
            len_bytes.try_into().expect("four bytes"),
        ))
        .ok()
        .and_then(|len| len_end.checked_add(len))
        .ok_or_else(|| self.corrupt("truncated"))?;
        let bytes = self
            .data
            .get(len_end..end)
            .ok_or_else(|| self.corrupt("truncated"))?;
        self.pos = end;
        Ok(bytes)
    }

    fn opt(&mut self, flags: u8, bit: u8) -> Result<Option<&'a str>, StoreError> {
        if flags & bit == 0 {
            Ok(None)
        } else {
            self.str().map(Some)
        }
    }
}

struct Raw<'a> {
    kind: u8,
    actor: u8,
    occurred_at: i64,
    /// The ref's fields stay bytes until needed: a reconcile page compares them with the ref it
    /// asked for, and checking each row's copy for UTF-8 would be wasted.
    session_key: &'a [u8],
    agent_id: &'a [u8],
    session_id: Option<&'a str>,
    actor_id: Option<&'a str>,
    run_id: Option<&'a str>,
    summary: &'a str,
    payload: Option<&'a str>,
    dedupe_key: Option<&'a str>,
}

fn parse(seq: u64, data: &[u8]) -> Result<Raw<'_>, StoreError> {
    let mut r = Reader {
        data,
        pos: HEADER,
        seq,
    };
    if data.len() < HEADER {
        return Err(r.corrupt("truncated"));
    }
    if data[0] != VERSION {
        return Err(r.corrupt(&format!("unknown row format {}", data[0])));
    }
    let flags = data[3];
    if flags & !KNOWN_FLAGS != 0 {
        return Err(r.corrupt(&format!("unknown presence flags {flags:#04x}")));
    }
    let occurred_at = i64::from_le_bytes(data[4..12].try_into().expect("eight bytes"));
    let session_key = r.bytes()?;
    let agent_id = r.bytes()?;
    let session_id = r.opt(flags, HAS_SESSION_ID)?;
    let actor_id = r.opt(flags, HAS_ACTOR_ID)?;
    let run_id = r.opt(flags, HAS_RUN_ID)?;
    let summary = r.str()?;
    let payload = r.opt(flags, HAS_PAYLOAD)?;
    let dedupe_key = r.opt(flags, HAS_DEDUPE)?;
    if r.pos != data.len() {
        return Err(r.corrupt("trailing bytes"));
    }
    Ok(Raw {
        kind: data[1],
        actor: data[2],
        occurred_at,
        session_key,
        agent_id,
        session_id,
        actor_id,
        run_id,
        summary,
        payload,
        dedupe_key,
    })
}

fn corrupt_row(seq: u64, what: &str) -> StoreError {
    StoreError::corrupt(format!("event row {seq}: {what}"))
}

/// Reads the bookkeeping fields of a row.
pub(crate) fn meta(seq: u64, data: &[u8]) -> Result<RowMeta<'_>, StoreError> {
    let raw = parse(seq, data)?;
    let utf8 = |b| std::str::from_utf8(b).map_err(|_| corrupt_row(seq, "a field is not UTF-8"));
    Ok(RowMeta {
        session_key: utf8(raw.session_key)?,
        agent_id: utf8(raw.agent_id)?,
        dedupe_key: raw.dedupe_key,
    })
}

/// Decodes a row into an event. When `known` is the ref the row was found under (a reconcile
/// page, which reads a session's copies in the reference index), its shared strings are reused
/// instead of allocating new ones, and a row naming another ref is corrupt (a hand edit or a
/// flipped bit): a page holds exactly its session's events.
pub(crate) fn decode(
    seq: u64,
    data: &[u8],
    known: Option<&SessionRef>,
) -> Result<Event, StoreError> {
    let raw = parse(seq, data)?;
    let bad = |what: &str| StoreError::corrupt(format!("event row {seq}: {what}"));
    let (session_key, agent_id) = match known {
        Some(r)
            if r.session_key.as_str().as_bytes() == raw.session_key
                && r.agent_id.as_str().as_bytes() == raw.agent_id =>
        {
            (r.session_key.clone(), r.agent_id.clone())
        }
        Some(r) => {
            let utf8 = |b| std::str::from_utf8(b).map_err(|_| bad("a field is not UTF-8"));
            return Err(bad(&format!(
                "indexed under {r}, names {:?} of agent {:?}",
                utf8(raw.session_key)?,
                utf8(raw.agent_id)?
            )));
        }
        None => {
            let utf8 = |b| std::str::from_utf8(b).map_err(|_| bad("a field is not UTF-8"));
            (
                SessionKey::new(utf8(raw.session_key)?).map_err(|e| bad(&e.to_string()))?,
                AgentId::new(utf8(raw.agent_id)?).map_err(|e| bad(&e.to_string()))?,
            )
        }
    };
    let payload = raw
        .payload
        .map(serde_json::from_str::<Payload>)
        .transpose()
        .map_err(|e| StoreError::Corrupt {
            context: format!("event row {seq}: payload is not a JSON object"),
            source: Some(Box::new(e)),
        })?;
    Ok(Event {
        sequence: Sequence(seq),
        session_key,
        session_id: raw.session_id.map(str::to_owned),
        agent_id,
        kind: stored_kind(raw.kind)
            .ok_or_else(|| bad(&format!("unknown kind code {}", raw.kind)))?,
        actor_type: actor_of(raw.actor)
            .ok_or_else(|| bad(&format!("unknown actor code {}", raw.actor)))?,
        actor_id: raw.actor_id.map(str::to_owned),
        run_id: raw.run_id.map(str::to_owned),
        occurred_at: Timestamp(raw.occurred_at),
        summary: raw.summary.to_owned(),
        payload,
        dedupe_key: raw.dedupe_key.map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use awareness_core::NewEvent;

    fn sample(full: bool) -> Event {
        let r = SessionRef::parse("agent:main:subagent:c1", "main").unwrap();
        let mut e = NewEvent::new(
            r,
            EventKind::RunFailed,
            ActorType::Agent,
            "child run failed",
        );
        if full {
            let mut p = Payload::new();
            p.insert("outcome".into(), "timeout".into());
            p.insert("ratio".into(), serde_json::json!(0.1 + 0.2));
            e = e
                .with_session_id("sid")
                .with_actor_id("agent:main:main")
                .with_run_id("run-1")
                .with_payload(p)
                .with_dedupe_key("run-terminal:run-1")
                .with_occurred_at(Timestamp(1_799_999_999_000));
        }
        e.into_event(Sequence(42), Timestamp(1_800_000_000_000))
    }

    #[test]
    fn round_trips_every_field() {
        for full in [false, true] {
            let e = sample(full);
            let bytes = encode(&e).unwrap();
            assert_eq!(decode(42, &bytes, None).unwrap(), e);
            assert_eq!(decode(42, &bytes, Some(&e.session_ref())).unwrap(), e);
            let m = meta(42, &bytes).unwrap();
            assert_eq!(m.session_key, "agent:main:subagent:c1");
            assert_eq!(m.agent_id, "main");
            assert_eq!(occurred_at(42, &bytes).unwrap(), e.occurred_at.millis());
            assert_eq!(m.dedupe_key, e.dedupe_key.as_deref());
        }
    }

    #[test]
    fn kind_and_actor_codes_are_distinct_and_decodable() {
        for k in EventKind::ALL {
            assert_eq!(kind_code(&k).and_then(kind_of), Some(k));
        }
        assert_eq!(kind_code(&EventKind::from_stored("session_reset")), None);
        for a in ActorType::ALL {
            assert_eq!(actor_of(actor_code(a)), Some(a));
        }
        assert_eq!(kind_of(0), None);
        assert_eq!(actor_of(0), None);
    }

    #[test]
    fn damaged_rows_are_corrupt_not_panics() {
        let bytes = encode(&sample(true)).unwrap();
        for cut in 0..bytes.len() {
            let err = decode(7, &bytes[..cut], None).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt { .. }), "{cut}: {err}");
        }
        let mut wrong = bytes.clone();
        wrong[0] = 9;
        assert!(
            decode(7, &wrong, None)
                .unwrap_err()
                .to_string()
                .contains("row format 9")
        );
        let mut wrong = bytes.clone();
        wrong[1] = 0;
        assert!(
            decode(7, &wrong, None)
                .unwrap_err()
                .to_string()
                .contains("kind code 0")
        );
        // A code after the nine, the first (10) to the last, is a later version's kind: read
        // as a kind this one does not know, the rest of the event as it is.
        for code in [10, 200, u8::MAX] {
            wrong[1] = code;
            let later = decode(7, &wrong, None).expect("a later version's kind");
            assert_eq!(later.kind, EventKind::Other(format!("kind code {code}")));
            assert!(!later.kind.is_known());
            assert_eq!(later.summary, sample(true).summary);
        }
        // A byte of the session key that is not UTF-8: corrupt whether or not the reader knows
        // the ref (the comparison with a known ref does not check UTF-8, and must not match).
        let mut bad_key = bytes.clone();
        bad_key[HEADER + 4] = 0xff;
        let e = sample(true);
        for known in [None, Some(e.session_ref())] {
            let err = decode(7, &bad_key, known.as_ref()).unwrap_err();
            assert!(err.to_string().contains("not UTF-8"), "{err}");
        }
        assert!(matches!(meta(7, &bad_key), Err(StoreError::Corrupt { .. })));
        // A presence flag the format does not know: read as clear, it decoded as a sound row.
        for bit in 5..8 {
            let mut flagged = bytes.clone();
            flagged[3] |= 1 << bit;
            let err = decode(7, &flagged, None).unwrap_err();
            assert!(err.to_string().contains("unknown presence flags"), "{err}");
        }
        let mut extra = bytes;
        extra.push(0);
        assert!(
            decode(7, &extra, None)
                .unwrap_err()
                .to_string()
                .contains("trailing")
        );
    }

    /// An actor code that no actor has (a flipped bit, a hand edit): the row is corrupt, never an
    /// event told as some actor's it does not name. (What the mutation did: such a code read as
    /// `system`, the event returned as the system's; review of stop 69, RE01.)
    #[test]
    fn an_unknown_actor_code_is_corrupt() {
        let mut bytes = encode(&sample(true)).unwrap();
        for code in [0, 4, u8::MAX] {
            bytes[2] = code;
            let err = decode(7, &bytes, None).expect_err("an actor code no actor has");
            assert!(
                err.to_string()
                    .contains(&format!("unknown actor code {code}")),
                "{err}"
            );
        }
    }

    /// Where `needle` first occurs in `hay`.
    fn find(hay: &[u8], needle: &[u8]) -> usize {
        hay.windows(needle.len())
            .position(|w| w == needle)
            .expect("needle in row")
    }

    /// A summary byte that is not UTF-8 (a flipped bit): the row is corrupt, never an event with
    /// some other summary. (What the mutation did: such a field read as an empty string, the event
    /// returned with its summary gone; review of stop 64, ME37.)
    #[test]
    fn a_summary_that_is_not_utf8_is_corrupt() {
        let mut bytes = encode(&sample(true)).unwrap();
        let at = find(&bytes, b"child run failed");
        bytes[at] = 0xff;
        for known in [None, Some(sample(true).session_ref())] {
            let err = decode(7, &bytes, known.as_ref())
                .expect_err("a summary that is not UTF-8 is corrupt");
            assert!(err.to_string().contains("not UTF-8"), "{err}");
        }
    }

    /// A row found under a ref whose key matches but whose agent differs names another ref:
    /// corrupt, not an event of the ref it was found under. (What the mutation did: only the key
    /// compared, and another agent's row showed in this session's page, relabelled with the
    /// requested agent; review of stop 64, ME38.)
    #[test]
    fn a_row_of_another_agent_under_a_known_ref_is_corrupt() {
        let e = sample(false);
        let bytes = encode(&e).unwrap();
        let other = SessionRef::parse("agent:main:subagent:c1", "ops").unwrap();
        let err =
            decode(7, &bytes, Some(&other)).expect_err("a row of agent main read under agent ops");
        assert!(err.to_string().contains("indexed under"), "{err}");
    }

    /// An agent id that is not UTF-8: the bookkeeping read of the row is corrupt too. (What the
    /// mutation did: read as an empty id, which every caller then refuses, so only the reason's
    /// wording changed; pinned to `meta`'s own contract; review of stop 64, ME39.)
    #[test]
    fn meta_of_an_agent_id_that_is_not_utf8_is_corrupt() {
        let mut bytes = encode(&sample(true)).unwrap();
        let at = find(&bytes, b"\x04\0\0\0main") + 4;
        bytes[at] = 0xff;
        assert!(
            matches!(meta(7, &bytes), Err(StoreError::Corrupt { .. })),
            "meta of an agent id that is not UTF-8 must be corrupt"
        );
    }

    /// A stored agent id that is UTF-8 but not a valid agent id (a colon): corrupt, not read as
    /// some other agent. (What the mutation did: read as `main`, the event taken for agent main's;
    /// review of stop 64, ME41.)
    #[test]
    fn an_invalid_stored_agent_id_is_corrupt() {
        let mut bytes = encode(&sample(false)).unwrap();
        let at = find(&bytes, b"\x04\0\0\0main") + 4;
        bytes[at + 1] = b':';
        let err = decode(7, &bytes, None).expect_err("agent id m:in is invalid");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    }
}
