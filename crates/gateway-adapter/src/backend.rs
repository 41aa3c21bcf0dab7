//! Choosing a backend at run time from a URL-like string.
//!
//! | URL | backend | cargo feature |
//! |---|---|---|
//! | `sqlite:///path/state.db` (or `sqlite:relative.db`) | store-sqlite | `sqlite` (default) |
//! | `redb:///path/state.redb` | store-redb | `redb` |
//! | `memory:` | store-memory | `memory` |

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::{AwarenessStore, FullStore, OpenFailure, StoreError};

/// A parsed store location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A redb file.
    Redb(PathBuf),
    /// In memory.
    Memory,
}

/// Why a store could not be opened from a URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL is not one of the accepted forms.
    #[error(
        "unsupported store URL {0:?}: use sqlite:///path, redb:///path or memory: (no query or fragment; write % ? # in a file name as %25 %3F %23)"
    )]
    BadUrl(String),
    /// [`repair_store`] was given `memory:`, which names no file: there is nothing to repair.
    #[error(
        "cannot repair store {0:?}: a memory store has no file to repair (repair takes sqlite:///path or redb:///path)"
    )]
    NothingToRepair(String),
    /// The backend exists but this build left out its cargo feature.
    #[error(
        "the {backend} backend is not compiled in: enable the gateway-adapter feature \"{backend}\""
    )]
    NotCompiled {
        /// The backend's feature name.
        backend: &'static str,
    },
    /// The backend refused to open.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl OpenError {
    /// Whether opening again may succeed: the store was busy ([`StoreError::is_retryable`],
    /// another connection holding the lock a migration needs, say), or its file is in use
    /// ([`OpenFailure::InUse`]: held by another process, a gateway that has not exited yet, or
    /// by read-only or closing handles of this process).
    /// A bad URL, a backend left out of the build or a file that is not a store stays as it
    /// is.
    pub fn is_retryable(&self) -> bool {
        matches!(self, OpenError::Store(e)
            if e.is_retryable() || e.open_failure() == Some(OpenFailure::InUse))
    }
}

impl StoreUrl {
    /// Parses `sqlite:///abs`, `sqlite://rel`, `sqlite:rel`, the same for `redb`, and `memory:`.
    /// The path is percent-decoded, as in a URL (`my%20state.db` is `my state.db`); a query or
    /// a fragment (`?mode=rwc`, which sqlx's own URLs take) is refused rather than taken as part
    /// of the file name, and so is a `%` that starts no escape or an escape that decodes to
    /// no UTF-8 text.
    pub fn parse(url: &str) -> Result<Self, OpenError> {
        let bad = || OpenError::BadUrl(url.to_owned());
        let path = |rest: &str| -> Result<PathBuf, OpenError> {
            let p = rest.strip_prefix("//").unwrap_or(rest);
            if p.is_empty() || p.contains(['?', '#']) {
                return Err(bad());
            }
            percent_decode(p).map(PathBuf::from).ok_or_else(bad)
        };
        if let Some(rest) = url.strip_prefix("sqlite:") {
            return Ok(StoreUrl::Sqlite(path(rest)?));
        }
        if let Some(rest) = url.strip_prefix("redb:") {
            return Ok(StoreUrl::Redb(path(rest)?));
        }
        if url == "memory:" || url == "memory://" {
            return Ok(StoreUrl::Memory);
        }
        Err(OpenError::BadUrl(url.to_owned()))
    }
}

/// Options of [`open_store`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Create the store when missing (a read-only tool passes `false`). Off, the open creates
    /// no store at all: a missing file, an empty one, or another application's database is
    /// refused, and left without our tables.
    pub create_if_missing: bool,
    /// Only read: no store is created (SQLite may add its `-wal` and `-shm` files beside one)
    /// and nothing in the file is written, not even a migration; every write fails with
    /// [`StoreError::ReadOnly`]. `memory:` has no file and ignores it.
    /// sqlite opens without its write connection and reads a database behind its schema (an
    /// OpenClaw database) as it is. redb opens the file read-only, which other read-only
    /// processes share, and a process that has it open read-write (a running gateway)
    /// excludes unless it opened it with [`OpenOptions::live_readers`]; a file that needs a
    /// repair or a migration is refused.
    pub read_only: bool,
    /// redb only: a read-write open lets other processes open the file read-only meanwhile
    /// and follow its commits (`store_redb::RedbOptions::live_readers`: two-phase commits, whose
    /// measured price is in decision 0009). Ignored by the other backends (SQLite always lets
    /// readers in) and by a read-only open.
    pub live_readers: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            create_if_missing: true,
            read_only: false,
            live_readers: false,
        }
    }
}

/// Opens the store a URL names, creating its file when missing. At shutdown, once every other
/// handle is dropped, close it with [`EventStore::close`](awareness_core::EventStore::close):
/// SQLite then moves its write-ahead log into the file, which a drop does not wait for.
pub async fn open_store(url: &str) -> Result<Arc<dyn AwarenessStore>, OpenError> {
    open_store_with(url, OpenOptions::default()).await
}

/// Opens the store a URL names.
pub async fn open_store_with(
    url: &str,
    options: OpenOptions,
) -> Result<Arc<dyn AwarenessStore>, OpenError> {
    let store: Arc<dyn AwarenessStore> = open_full_store_with(url, options).await?;
    Ok(store)
}

/// Opens the store a URL names with its upstream links too, creating its file when missing.
pub async fn open_full_store(url: &str) -> Result<Arc<dyn FullStore>, OpenError> {
    open_full_store_with(url, OpenOptions::default()).await
}

/// Opens the store a URL names with its upstream links too (every backend has them). The
/// result converts into `Arc<dyn AwarenessStore>` and `Arc<dyn UpstreamStore>`.
pub async fn open_full_store_with(
    url: &str,
    options: OpenOptions,
) -> Result<Arc<dyn FullStore>, OpenError> {
    let _ = options;
    match StoreUrl::parse(url)? {
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => {
            let opts = store_sqlite::SqliteOptions::new()
                .create_if_missing(options.create_if_missing && !options.read_only)
                .read_only(options.read_only);
            Ok(Arc::new(
                store_sqlite::SqliteStore::open_with(path, opts).await?,
            ))
        }
        #[cfg(not(feature = "sqlite"))]
        StoreUrl::Sqlite(_) => Err(OpenError::NotCompiled { backend: "sqlite" }),
        #[cfg(feature = "redb")]
        StoreUrl::Redb(path) => {
            let opts = store_redb::RedbOptions {
                create_if_missing: options.create_if_missing,
                read_only: options.read_only,
                live_readers: options.live_readers,
                ..store_redb::RedbOptions::default()
            };
            Ok(Arc::new(
                store_redb::RedbStore::open_with(path, opts).await?,
            ))
        }
        #[cfg(not(feature = "redb"))]
        StoreUrl::Redb(_) => Err(OpenError::NotCompiled { backend: "redb" }),
        #[cfg(feature = "memory")]
        StoreUrl::Memory => Ok(Arc::new(store_memory::MemoryStore::new())),
        #[cfg(not(feature = "memory"))]
        StoreUrl::Memory => Err(OpenError::NotCompiled { backend: "memory" }),
    }
}

/// What [`repair_store`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// redb: a read-only open refused the file (its writer crashed or was killed, or it is of
    /// schema 1), so it was opened read-write and closed cleanly, which repaired (or migrated)
    /// it: read-only opens take it from now on.
    Reopened {
        /// Events the store holds.
        events: u64,
    },
    /// Nothing to repair: the file opened read-only and was only read, unchanged. SQLite's
    /// always does (any reader recovers its write-ahead log itself); a redb file does when its
    /// last writer closed it cleanly (or still has it open with live readers) and it is of
    /// this build's schema.
    NotNeeded {
        /// Events the store holds.
        events: u64,
    },
}

/// Readies an existing store for read-only opens after its writer crashed, changing nothing
/// else. The file is first opened read-only; when that opens it, there is nothing to repair
/// and nothing is written ([`Repair::NotNeeded`]: always for SQLite, whose readers recover its
/// write-ahead log themselves). A redb file the read-only open refuses as not closed cleanly
/// ([`StoreError::NeedsRepair`]) or of schema 1 ([`OpenFailure::NeedsMigration`]) is then
/// opened read-write and closed cleanly: redb repairs it while opening it, and a schema 1 file
/// is migrated, as any read-write open does ([`Repair::Reopened`]). Any other refusal of the
/// read-only open is returned as it is, the file not written to: nothing is created for a
/// missing or empty file, and a file that is not a store of that backend, or is in use, is
/// left as it was. (A redb file not closed cleanly is repaired by redb before anything in it
/// can be read, so one of another application, or of a later schema, gets redb's repair
/// before the read-write open refuses it, as at any read-write open: [`StoreError::Open`].)
/// `memory:` has no file: it is refused with [`OpenError::NothingToRepair`].
pub async fn repair_store(url: &str) -> Result<Repair, OpenError> {
    let (path, sqlite) = match StoreUrl::parse(url)? {
        StoreUrl::Sqlite(p) => (p, true),
        StoreUrl::Redb(p) => (p, false),
        StoreUrl::Memory => return Err(OpenError::NothingToRepair(url.to_owned())),
    };
    if std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == 0) {
        return Err(StoreError::open(
            path,
            OpenFailure::NotAStore,
            "an empty file, not a store (repair creates nothing)",
            None,
        )
        .into());
    }
    let options = |read_only| OpenOptions {
        create_if_missing: false,
        read_only,
        live_readers: false,
    };
    let (store, reopened) = match open_full_store_with(url, options(true)).await {
        Ok(store) => (store, false),
        // Only what a read-write open mends is opened so: a file its writer left open, or one
        // of the older schema. Any other refusal is the answer (a file that is not a store, in
        // use, missing, ...), and the file is not written to.
        Err(OpenError::Store(e))
            if !sqlite
                && (matches!(e, StoreError::NeedsRepair { .. })
                    || e.open_failure() == Some(OpenFailure::NeedsMigration)) =>
        {
            tracing::debug!(path = %path.display(), error = %e, "repair: opening the file read-write");
            (open_full_store_with(url, options(false)).await?, true)
        }
        Err(e) => return Err(e),
    };
    let stats = store.log_stats().await;
    store.close().await;
    let events = stats?.rows;
    Ok(if reopened {
        Repair::Reopened { events }
    } else {
        Repair::NotNeeded { events }
    })
}

/// `text` with each `%XX` escape replaced by its byte; `None` for a `%` that starts no escape
/// of two hex digits, or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_owned());
    }
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail
                .get(..2)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))?;
            bytes.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a busy store, or a file in use, is worth opening again.
    #[test]
    fn only_a_busy_or_in_use_open_is_retryable() {
        let busy = StoreError::Busy {
            context: "open".into(),
            source: "locked".into(),
        };
        assert!(OpenError::Store(busy).is_retryable());
        let refused = |kind| StoreError::open("/x.db", kind, "refused", None);
        assert!(OpenError::Store(refused(OpenFailure::InUse)).is_retryable());
        for kind in [
            OpenFailure::NotAStore,
            OpenFailure::NotFound,
            OpenFailure::Unsupported,
            OpenFailure::PermissionDenied,
            OpenFailure::InvalidOptions,
            OpenFailure::Other,
        ] {
            assert!(!OpenError::Store(refused(kind)).is_retryable(), "{kind}");
        }
        assert!(!StoreUrl::parse("postgres://x").unwrap_err().is_retryable());
    }

    /// A URL's path is percent-decoded; a query or fragment, or a broken escape, is refused
    /// instead of becoming part of a file name (`sqlite:///tmp/x.db?mode=rwc` created a file
    /// named `x.db?mode=rwc`).
    #[test]
    fn url_paths_are_percent_decoded_and_queries_refused() {
        assert_eq!(
            StoreUrl::parse("sqlite:///tmp/my%20state.db").unwrap(),
            StoreUrl::Sqlite("/tmp/my state.db".into())
        );
        assert_eq!(
            StoreUrl::parse("redb:///tmp/100%25%3F%23.redb").unwrap(),
            StoreUrl::Redb("/tmp/100%?#.redb".into())
        );
        assert_eq!(
            StoreUrl::parse("sqlite:///tmp/caf%C3%A9.db").unwrap(),
            StoreUrl::Sqlite("/tmp/caf\u{e9}.db".into())
        );
        for bad in [
            "sqlite:///tmp/x.db?mode=rwc",
            "redb:///tmp/x.redb#top",
            "sqlite:///tmp/50%.db",
            "sqlite:///tmp/%zz.db",
            "sqlite:///tmp/%FF.db",
            "sqlite:///tmp/a%+1.db",
        ] {
            assert!(
                matches!(StoreUrl::parse(bad), Err(OpenError::BadUrl(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn urls() {
        assert_eq!(
            StoreUrl::parse("sqlite:///tmp/a.db").unwrap(),
            StoreUrl::Sqlite("/tmp/a.db".into())
        );
        assert_eq!(
            StoreUrl::parse("sqlite:a.db").unwrap(),
            StoreUrl::Sqlite("a.db".into())
        );
        assert_eq!(
            StoreUrl::parse("redb:///x/s.redb").unwrap(),
            StoreUrl::Redb("/x/s.redb".into())
        );
        assert_eq!(StoreUrl::parse("memory:").unwrap(), StoreUrl::Memory);
        for bad in ["", "postgres://x", "sqlite:", "sqlite://", "/tmp/a.db"] {
            assert!(StoreUrl::parse(bad).is_err(), "{bad}");
        }
    }

    /// Bug: repairing `memory:` was refused as an unsupported URL whose text listed `memory:`
    /// among the supported ones.
    #[tokio::test]
    async fn repairing_a_memory_store_says_it_has_no_file() {
        for url in ["memory:", "memory://"] {
            let err = repair_store(url).await.unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "cannot repair store {url:?}: a memory store has no file to repair \
                     (repair takes sqlite:///path or redb:///path)"
                ),
            );
        }
    }
}
