//! Mapping sqlx / SQLite errors onto [`StoreError`] by meaning.

use std::path::Path;

use awareness_core::{OpenFailure, StoreError};

const SQLITE_PERM: i32 = 3;
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_CORRUPT: i32 = 11;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;
const SQLITE_PROTOCOL: i32 = 15;
const SQLITE_NOTADB: i32 = 26;

/// The primary SQLite result code of a database error.
pub(crate) fn primary_code(e: &sqlx::Error) -> Option<i32> {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .map(|c| c & 0xff),
        _ => None,
    }
}

/// A failure while `context` was being done: BUSY/LOCKED are retryable, CORRUPT/NOTADB are
/// corruption, everything else is a backend error. The original error is kept as the source.
pub(crate) fn map(context: &str, e: sqlx::Error) -> StoreError {
    if is_busy(&e) {
        StoreError::Busy {
            context: context.to_owned(),
            source: Box::new(e),
        }
    } else if is_unusable_file(&e) {
        StoreError::Corrupt {
            context: context.to_owned(),
            source: Some(Box::new(e)),
        }
    } else {
        StoreError::backend(context, e)
    }
}

/// Whether the error is SQLite's BUSY or LOCKED (another connection holds a lock), or
/// PROTOCOL (a race for the write-ahead log's locks that SQLite's own retries lost, which
/// SQLite's documentation says may succeed when tried again). LOCKED is taken as retryable as
/// BUSY is (CONVENTIONS.md): without a shared cache, which this store never enables, it means
/// a conflict inside one connection, which the store's own transactions do not make.
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    matches!(
        primary_code(e),
        Some(SQLITE_BUSY | SQLITE_LOCKED | SQLITE_PROTOCOL)
    )
}

/// Whether `e`, as [`map`] left it, is SQLite's FULL: a full disk, or a table's AUTOINCREMENT
/// counter at its end (`i64::MAX`), which SQLite answers with the same code and message.
pub(crate) fn is_full(e: &StoreError) -> bool {
    matches!(e, StoreError::Backend { source, .. }
        if source.downcast_ref::<sqlx::Error>().and_then(primary_code) == Some(SQLITE_FULL))
}

/// Whether the error is SQLite's READONLY: the connection may not write the file.
pub(crate) fn is_read_only(e: &sqlx::Error) -> bool {
    primary_code(e) == Some(SQLITE_READONLY)
}

/// Whether the error says the file is no usable SQLite database at all.
pub(crate) fn is_unusable_file(e: &sqlx::Error) -> bool {
    matches!(primary_code(e), Some(SQLITE_NOTADB | SQLITE_CORRUPT))
}

/// Why a database could not be opened, in words a person can act on. SQLite's own words are
/// not repeated here: the error is the [`StoreError::Open`]'s source, which a reporter of the
/// whole chain ([`awareness_core::error::ErrorChain`]) prints after these. (BUSY, LOCKED and
/// PROTOCOL never get here: [`failed_open`] answers them with [`StoreError::Busy`].)
pub(crate) fn open_reason(e: &sqlx::Error) -> &'static str {
    match primary_code(e) {
        Some(SQLITE_NOTADB) => "the file is not an SQLite database",
        Some(SQLITE_CORRUPT) => "the database file is corrupt or truncated",
        Some(SQLITE_CANTOPEN) => "the file or its journal cannot be opened or created",
        Some(SQLITE_READONLY) => {
            "the database is read-only here (no write permission to the file or its directory)"
        }
        Some(SQLITE_PERM) => "permission denied",
        Some(SQLITE_IOERR) => "an I/O error occurred",
        _ => "SQLite refused to open it",
    }
}

/// The error of an open of `path` that failed on `e`: [`StoreError::Busy`] when another
/// connection held the lock the open needed (a migration's) for longer than the busy timeout,
/// which a later open may not meet, naming the file first as every error of a store in a file
/// does ([`StoreError::in_store`]: `store busy: /x.db: open: ...`); else [`StoreError::Open`],
/// with [`open_reason`].
pub(crate) fn failed_open(path: &Path, e: sqlx::Error) -> StoreError {
    if is_busy(&e) {
        return StoreError::Busy {
            context:
                "open: another connection held the database's lock longer than the busy timeout"
                    .to_owned(),
            source: Box::new(e),
        }
        .in_store(path);
    }
    let kind = match primary_code(&e) {
        Some(SQLITE_NOTADB) => OpenFailure::NotAStore,
        Some(SQLITE_READONLY | SQLITE_PERM) => OpenFailure::PermissionDenied,
        // SQLite says neither which file nor why: the file itself, asked again, may say (a
        // file this user may not read, or gone since it was looked at); else it was something
        // SQLite keeps beside it.
        Some(SQLITE_CANTOPEN) => std::fs::File::open(path)
            .err()
            .map_or(OpenFailure::Other, |e| OpenFailure::of_io(&e)),
        _ => OpenFailure::Other,
    };
    open(path, kind, open_reason(&e), Some(Box::new(e)))
}

/// [`failed_open`] for a new store being made under another name, before anything is at
/// `path`: a missing file there says nothing of why, so what is not a busy lock is
/// [`OpenFailure::Other`] unless SQLite's code says more (not a database, permissions).
pub(crate) fn failed_create(path: &Path, e: sqlx::Error) -> StoreError {
    match failed_open(path, e) {
        StoreError::Open {
            path,
            kind: OpenFailure::NotFound,
            reason,
            source,
        } => open(&path, OpenFailure::Other, reason, source),
        other => other,
    }
}

/// A [`StoreError::Open`] for `path`.
pub(crate) fn open(
    path: &Path,
    kind: OpenFailure,
    reason: impl Into<String>,
    source: Option<awareness_core::BoxError>,
) -> StoreError {
    StoreError::open(path, kind, reason, source)
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    /// A database error with SQLite's (extended) result code `code`, and its message.
    #[derive(Debug)]
    struct Coded(i32, &'static str);

    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "result code {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            self.1
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Owned(self.0.to_string()))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn coded(code: i32) -> sqlx::Error {
        sqlx::Error::Database(Box::new(Coded(code, "coded")))
    }

    /// An open that met a lock names the file first, then what was being done, as every
    /// other error of a store in a file does (`StoreError::in_store`), and its cause once.
    #[test]
    fn a_busy_open_names_the_file_first() {
        let e = failed_open(Path::new("/x.db"), coded(SQLITE_BUSY));
        assert_eq!(
            awareness_core::error::ErrorChain(&e).to_string(),
            "store busy: /x.db: open: another connection held the database's lock longer than \
             the busy timeout: error returned from database: result code 5"
        );
    }

    /// An open's reason is ours; SQLite's words are its source, shown once in the chain.
    #[test]
    fn an_open_error_shows_sqlites_words_once() {
        let e = failed_open(Path::new("/x.db"), coded(SQLITE_NOTADB));
        assert!(std::error::Error::source(&e).is_some(), "{e:?}");
        let chain = awareness_core::error::ErrorChain(&e).to_string();
        assert_eq!(chain.matches("result code 26").count(), 1, "{chain}");
        assert_eq!(e.to_string().matches("result code 26").count(), 0, "{e}");
    }

    /// SQLite's PERM is a permission refusal, as its READONLY is; and a new store that could
    /// not be made is no missing file (its path is not there yet, by design) whatever SQLite
    /// answered. (PERM left to `Other`, and a failed create's `NotFound` kept, two mutations
    /// every test passed: the file tests run as root, where SQLite answers neither: review of
    /// stop 61.)
    #[test]
    fn perm_is_a_refused_permission_and_a_failed_create_is_no_missing_file() {
        let kind = |e: StoreError| match e {
            StoreError::Open { kind, .. } => kind,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            kind(failed_open(Path::new("/x.db"), coded(SQLITE_PERM))),
            OpenFailure::PermissionDenied
        );
        let missing = Path::new("/no-such-directory-here/new.db");
        assert_eq!(
            kind(failed_create(missing, coded(SQLITE_CANTOPEN))),
            OpenFailure::Other
        );
    }

    /// SQLite's CANTOPEN at an open is said in words of its own: the file or its journal could
    /// not be opened or created, which points at the file and the directory beside it.
    /// (What the mutation did: CANTOPEN was given the catch-all "SQLite refused to open it";
    /// review of stop 72, SJ41.)
    #[test]
    fn cantopen_at_an_open_says_the_file_or_its_journal_could_not_be_opened() {
        let e = failed_open(Path::new("/x.db"), coded(SQLITE_CANTOPEN));
        let StoreError::Open { reason, .. } = e else {
            panic!("{e:?}")
        };
        assert_eq!(
            reason,
            "the file or its journal cannot be opened or created"
        );
    }

    /// The lock conflicts are retryable, extended codes by their primary code (BUSY_SNAPSHOT
    /// is 517, PROTOCOL 15); a corrupt file is corruption; the rest is a backend failure,
    /// which retrying does not cure.
    #[test]
    fn lock_conflicts_are_retryable_and_nothing_else_is() {
        for code in [SQLITE_BUSY, SQLITE_LOCKED, SQLITE_PROTOCOL, 517, 262] {
            let e = map("record", coded(code));
            assert!(
                matches!(e, StoreError::Busy { .. }) && e.is_retryable(),
                "{code}: {e:?}"
            );
            assert!(
                matches!(
                    failed_open(Path::new("/x.db"), coded(code)),
                    StoreError::Busy { .. }
                ),
                "{code}: an open"
            );
        }
        for code in [SQLITE_CORRUPT, SQLITE_NOTADB] {
            assert!(
                matches!(map("read", coded(code)), StoreError::Corrupt { .. }),
                "{code}"
            );
        }
        for code in [SQLITE_FULL, SQLITE_IOERR, SQLITE_READONLY, SQLITE_PERM, 1] {
            let e = map("record", coded(code));
            assert!(
                matches!(e, StoreError::Backend { .. }) && !e.is_retryable(),
                "{code}: {e:?}"
            );
        }
    }
}
