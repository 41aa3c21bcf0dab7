//! # awareness-core
//!
//! The pure heart of *session state awareness*: when several sessions of an agent gateway work one
//! problem, each learns once and cheaply that another actor changed a session it depends on, and
//! can fetch the exact delta before it acts.
//!
//! This crate holds everything that is decided once for all backends:
//!
//! - [`model`]: keys, sequences, events, heads, cursors (parse at the boundary, trust the type);
//! - [`validate`]: input rules with typed errors, and `occurredAt` clamping;
//! - [`protocol`]: the notice protocol (seed, watch, material, acknowledge, re-freeze), the exact
//!   notice text and the queue's context key;
//! - [`reconcile`]: the `changesSince` page and `session_status`;
//! - [`retention`]: what pruning deletes and how watermarks are stamped;
//! - [`store`]: the [`EventStore`] and [`CursorStore`] traits;
//! - [`error`]: [`StoreError`], the one error type every backend returns (an open's failure
//!   said by kind too: [`OpenFailure`]), [`error::ErrorChain`] to display an error with its
//!   sources, and the message of a caught panic;
//! - [`dedupe`]: the dedupe key DESIGN.md section 3 gives each producer's events, so that a
//!   retried producer records its event once;
//! - [`audit`]: the invariants a store's rows must keep, checked over rows or over a store that
//!   may be live (what `awareness doctor` runs);
//! - [`upstream`]: upstream links of adopted sessions, their rules (same-source refresh,
//!   rebase, compare-and-set markers), the monitor's dedupe keys and self-echo normalization,
//!   and the [`UpstreamStore`] trait ([`FullStore`] = both traits);
//! - `testkit` (feature `testkit`): the conformance suite and the model test every backend runs.
//!
//! It does no I/O and needs no runtime. Pick a backend crate (`store-memory`, `store-sqlite`,
//! `store-redb`, `store-postgres`) to persist it.
//!
//! ```
//! use awareness_core::{protocol, Cursor, SessionRef, Sequence, Timestamp, WatcherKey};
//!
//! let manager = WatcherKey::parse("agent:main:main")?;
//! let child = SessionRef::parse("agent:main:subagent:child", "main")?;
//! // The spawn at sequence 1 seeds the manager's cursor.
//! let cursor = Cursor::at(manager, child, Sequence(1), Timestamp(0));
//! // Twenty human messages freeze one notice at the first of them.
//! let mut c = cursor;
//! for seq in 2..=21 {
//!     c = protocol::material(c, Sequence(seq), Timestamp(0));
//! }
//! assert_eq!((c.notified, c.material), (Sequence(2), Sequence(21)));
//! let notice = protocol::Notice::of(&c);
//! assert_eq!(
//!     notice.text(),
//!     "Session \"agent:main:subagent:child\" changed (other actor). Reconcile before acting: \
//!      session_status sessionKey \"agent:main:subagent:child\" changesSince 1."
//! );
//! # Ok::<(), awareness_core::ValidationError>(())
//! ```

pub mod audit;
pub mod dedupe;
pub mod error;
#[cfg(feature = "hints")]
pub mod hints;
pub mod model;
pub mod protocol;
pub mod queue;
pub mod reconcile;
pub mod retention;
pub mod store;
pub mod upstream;
pub mod validate;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use async_trait::async_trait;
pub use error::{BoxError, OpenFailure, StoreError};
pub use model::{
    ActorType, AgentId, Cursor, CursorFilter, CursorKey, Event, EventKind, Head, KindClass,
    LogStats, NewEvent, Payload, Sequence, SessionKey, SessionRef, Timestamp, WatchProvenance,
    WatcherKey,
};
pub use protocol::{AckTarget, Notice, ReadNotice};
pub use reconcile::{ChangesPage, SessionStatus};
pub use retention::{PruneReport, PruneStep, RetentionPolicy};
pub use store::{
    AwarenessStore, AwarenessStoreExt, CommitHints, CursorStore, EventStore, Recorded,
    UnreadableCursor,
};
pub use upstream::{FullStore, LinkSpec, UpsertOutcome, UpstreamLink, UpstreamStore};
pub use validate::ValidationError;
