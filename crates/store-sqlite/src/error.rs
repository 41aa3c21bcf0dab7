//! Mapping sqlx / SQLite errors onto [`StoreError`] by meaning.

use std::path::Path;

use awareness_core::StoreError;

const SQLITE_PERM: i32 = 3;
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_CORRUPT: i32 = 11;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;
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

/// Whether the error is SQLite's BUSY or LOCKED: another connection holds a lock.
pub(crate) fn is_busy(e: &sqlx::Error) -> bool {
    matches!(primary_code(e), Some(SQLITE_BUSY | SQLITE_LOCKED))
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

/// Why a database could not be opened, in words a person can act on.
pub(crate) fn open_reason(e: &sqlx::Error) -> String {
    let what = match primary_code(e) {
        Some(SQLITE_NOTADB) => "the file is not an SQLite database",
        Some(SQLITE_CORRUPT) => "the database file is corrupt or truncated",
        Some(SQLITE_CANTOPEN) => "the file or its journal cannot be opened or created",
        Some(SQLITE_READONLY) => {
            "the database is read-only here (no write permission to the file or its directory)"
        }
        Some(SQLITE_PERM) => "permission denied",
        Some(SQLITE_BUSY | SQLITE_LOCKED) => "the database is locked by another connection",
        Some(SQLITE_IOERR) => "an I/O error occurred",
        _ => "SQLite refused to open it",
    };
    format!("{what} ({e})")
}

/// The error of an open of `path` that failed on `e`: [`StoreError::Busy`] when another
/// connection held the lock the open needed (a migration's) for longer than the busy timeout,
/// which a later open may not meet; else [`StoreError::Open`], with [`open_reason`].
pub(crate) fn failed_open(path: &Path, e: sqlx::Error) -> StoreError {
    if is_busy(&e) {
        return StoreError::Busy {
            context: format!(
                "open {}: another connection held the database's lock longer than the busy timeout",
                path.display()
            ),
            source: Box::new(e),
        };
    }
    open(path, open_reason(&e), Some(Box::new(e)))
}

/// A [`StoreError::Open`] for `path`.
pub(crate) fn open(
    path: &Path,
    reason: impl Into<String>,
    source: Option<awareness_core::BoxError>,
) -> StoreError {
    StoreError::Open {
        path: path.to_path_buf(),
        reason: reason.into(),
        source,
    }
}
