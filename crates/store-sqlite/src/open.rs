//! Opening: checking the path, creating a missing store with mode 0600 where no other opener
//! sees it before it is complete, preparing the write connection (also when other connections
//! prepare theirs at the same moment), and leaving nothing behind when a damaged file is refused.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use awareness_core::{OpenFailure, StoreError, Timestamp};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _, SqliteConnection};

use crate::{SqliteOptions, error, schema, sql};

/// WAL mode (persistent in the file), then the schema.
///
/// Connections that open one file at the same moment (two handles, two processes) may all find
/// it in rollback mode, and all switch it to WAL: each reads the header, then asks for the write
/// lock to change it, and SQLite answers BUSY at once, without the busy timeout, to one that
/// reads while another holds the write lock (waiting could deadlock: the holder may be waiting
/// for that read to end). So a BUSY or LOCKED answer is tried again, after waiting (with the busy
/// timeout) until no other connection holds the write lock, as long as less than the busy
/// timeout has passed since the first try: the retry finds the switch (or the migration) made by
/// the other connection and has nothing left to do. A lock still held after that is reported.
/// `path`, the store's file, names it in the warnings.
pub(crate) async fn init_writer(
    conn: &mut SqliteConnection,
    path: &Path,
    busy_timeout: Duration,
) -> Result<(), sqlx::Error> {
    let started = Instant::now();
    loop {
        let e = match init_once(conn, path).await {
            Err(e) if error::is_busy(&e) && started.elapsed() < busy_timeout => e,
            done => return done,
        };
        tracing::debug!(error = %awareness_core::error::ErrorChain(&e), "the file was locked while preparing the write connection; trying again");
        if let Err(wait) = sqlx::raw_sql(sql::WAIT_FOR_WRITER)
            .execute(&mut *conn)
            .await
        {
            tracing::debug!(error = %awareness_core::error::ErrorChain(&wait), "waiting for the write lock");
            return Err(e);
        }
    }
}

/// SQLite's refusal to write through the write connection, asked before anything reads the
/// file: when this user may not write it (its mode, its owner, a read-only file system), SQLite
/// opens it read-only without a word, and the first read of a WAL store then creates its `-wal`
/// and `-shm` (with the file's mode, owned by this user), which a read-only connection does not
/// remove when it closes. Left behind by the refusal, they blocked the next open once the file
/// was made writable (opened read-only in turn, and refused again), or stayed in a shared
/// directory owned by the refused user. `None` when the file takes writes as far as this can
/// tell.
///
/// The question is a write that needs no schema (so nothing reads the file to prepare it),
/// `PRAGMA user_version = 0` in a transaction that is always rolled back: on a connection
/// that opened the file read-only, SQLite refuses to begin its write transaction with a plain
/// SQLITE_READONLY before it reads the file or takes a lock (`BEGIN IMMEDIATE` would not do:
/// on such a connection it begins a read transaction, and reads). On a writable file it takes
/// the write lock without waiting (a BUSY answer says the file is writable as far as this can
/// tell) and changes the header only in memory: nothing is written. Any other failure (the
/// file is no database, the directory is not writable) is left to the open's later steps,
/// which report it as before.
///
/// Asked of SQLite rather than by opening the file for writing here: closing a descriptor of
/// our own would release every POSIX lock this process holds on the file, those of another
/// handle's connections included (SQLite's "posix advisory locks canceled by a separate thread
/// doing close()"), and another process could then checkpoint and remove the WAL under them.
pub(crate) async fn file_opened_read_only(
    conn: &mut SqliteConnection,
    busy_timeout: Duration,
) -> Result<Option<sqlx::Error>, sqlx::Error> {
    set_busy_timeout(conn, Duration::ZERO).await?;
    sqlx::raw_sql("BEGIN").execute(&mut *conn).await?;
    let probed = sqlx::raw_sql("PRAGMA main.user_version = 0")
        .execute(&mut *conn)
        .await;
    let rolled_back = sqlx::raw_sql(sql::ROLLBACK).execute(&mut *conn).await;
    set_busy_timeout(conn, busy_timeout).await?;
    match (probed, rolled_back) {
        (Err(e), _) if is_plain_read_only(&e) => Ok(Some(e)),
        // A failed statement may have ended the transaction itself (SQLite rolls back on some
        // errors), and then there was nothing left to roll back.
        (Err(e), Err(rollback)) => {
            tracing::debug!(error = %awareness_core::error::ErrorChain(&e), rollback = %awareness_core::error::ErrorChain(&rollback), "asking whether the file is read-only");
            Ok(None)
        }
        (_, Err(rollback)) => Err(rollback),
        _ => Ok(None),
    }
}

/// Sets the connection's busy timeout: the probes ask without waiting for another
/// connection's lock, then give back the open's own (at most `i32::MAX` ms, as
/// `SqliteOptions::busy_timeout` keeps it).
async fn set_busy_timeout(conn: &mut SqliteConnection, wait: Duration) -> Result<(), sqlx::Error> {
    let set = format!("PRAGMA busy_timeout = {}", wait.as_millis());
    sqlx::raw_sql(sqlx::AssertSqlSafe(set))
        .execute(&mut *conn)
        .await
        .map(drop)
}

/// SQLITE_READONLY itself, not one of its extended codes (a directory, a `-shm` or a recovery
/// that cannot be written): the refusal of a connection that opened the file read-only.
fn is_plain_read_only(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("8"))
}

/// SQLite's refusal to write through the write connection, when it opened the file read-only
/// for it: it does so, without an error, when the file may not be written (its mode, its
/// owner, a read-only file system), and an up-to-date WAL store then opens with nothing
/// written, to fail every write later. `None` when the file takes writes.
///
/// SQLite grants such a connection the write lock (in WAL mode the lock lives in the `-shm`
/// file) and refuses only the first change of a page, so the probe changes one, the header's
/// `user_version` to the value it has, in a transaction it rolls back: nothing is written.
/// It does not wait for the lock: a lock another connection holds (BUSY) says the file is
/// writable as far as this can tell.
pub(crate) async fn opened_read_only(
    conn: &mut SqliteConnection,
    busy_timeout: Duration,
) -> Result<Option<sqlx::Error>, sqlx::Error> {
    set_busy_timeout(conn, Duration::ZERO).await?;
    let probed = probe_write(conn).await;
    set_busy_timeout(conn, busy_timeout).await?;
    match probed {
        Err(e) if error::is_read_only(&e) => Ok(Some(e)),
        Err(e) if error::is_busy(&e) => Ok(None),
        Err(e) => Err(e),
        Ok(()) => Ok(None),
    }
}

/// The write [`opened_read_only`] tries, rolled back whatever it meets.
async fn probe_write(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    let changed = async {
        let version: i64 = sqlx::query_scalar("PRAGMA user_version")
            .fetch_one(&mut *conn)
            .await?;
        let same = format!("PRAGMA user_version = {version}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(same))
            .execute(&mut *conn)
            .await
            .map(drop)
    }
    .await;
    let rolled_back = sqlx::raw_sql(sql::ROLLBACK).execute(&mut *conn).await;
    changed.and(rolled_back.map(drop))
}

async fn init_once(conn: &mut SqliteConnection, path: &Path) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sql::WRITER_PRAGMAS)
        .execute(&mut *conn)
        .await?;
    schema::migrate(conn, path, Timestamp::now().millis()).await
}

/// The file SQLite keeps beside the database at `path` under `suffix` (`-wal`, `-shm`,
/// `-journal`).
fn companion(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// SQLite's `-wal` and `-shm` files of a database, and whether they existed before we opened
/// it: reading a damaged WAL-mode file makes SQLite create them before it notices the damage.
/// They are beside the file itself: SQLite resolves a symbolic link at the path it is given
/// (on Unix; see [`resolved`]).
pub(crate) struct Companions {
    paths: [PathBuf; 2],
    existed: [bool; 2],
}

impl Companions {
    pub(crate) fn before_open(path: &Path) -> Self {
        let real = resolved(path);
        let paths = ["-wal", "-shm"].map(|suffix| companion(&real, suffix));
        let existed = [paths[0].exists(), paths[1].exists()];
        Self { paths, existed }
    }

    /// After a failed open of a file that is no usable database (so no healthy process can be
    /// using these files), removes the companions this open created: nothing is left behind.
    pub(crate) fn remove_if_unusable(&self, e: &sqlx::Error) {
        if !error::is_unusable_file(e) {
            return;
        }
        for (p, existed) in self.paths.iter().zip(self.existed) {
            let empty_wal = p == &self.paths[0] && std::fs::metadata(p).is_ok_and(|m| m.len() == 0);
            if !existed
                && (p == &self.paths[1] || empty_wal)
                && let Err(e) = std::fs::remove_file(p)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove a file a failed open created");
            }
        }
    }
}

/// Checks the path and, when the file is missing, creates a new store there with mode 0600
/// (see [`create`]). Returns whether this open created it.
pub(crate) async fn prepare_file(
    path: &Path,
    options: &SqliteOptions,
    connect: &SqliteConnectOptions,
) -> Result<bool, StoreError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {
            refuse_other_names(path, &m)?;
            // An empty file holds no database yet, and SQLite takes companions beside it for
            // its own as it would beside a missing one (and deletes a log it finds there):
            // what a store moved away while open, and an empty file put in its place, would
            // do to the moved store's log (its committed events with it).
            // Beside the file itself: SQLite names them after a symbolic link resolved. A
            // journal is not played back over an empty file, and another opener making the
            // store in this empty file has one for a moment: not looked at.
            if m.len() == 0 {
                refuse_stray_companions(
                    path,
                    &resolved(path),
                    "the file is empty (no database yet)",
                    false,
                    || std::fs::metadata(path).is_ok_and(|m| m.len() == 0),
                )?;
            }
            Ok(false)
        }
        Ok(_) => Err(error::open(
            path,
            OpenFailure::NotAStore,
            "it is not a regular file",
            None,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if options.read_only || !options.create_if_missing {
                return Err(error::open(
                    path,
                    OpenFailure::NotFound,
                    "the file does not exist",
                    Some(Box::new(e)),
                ));
            }
            let parent = parent(path);
            if !parent.is_dir() {
                return Err(error::open(
                    path,
                    OpenFailure::NotFound,
                    format!("its directory {} does not exist", parent.display()),
                    None,
                ));
            }
            create(path, connect).await
        }
        Err(e) => Err(error::open(
            path,
            OpenFailure::of_io(&e),
            "cannot inspect it",
            Some(Box::new(e)),
        )),
    }
}

/// The start of the name [`create`] prepares a new store under (`.awareness-new-<pid>-<n>`).
const STAGED_PREFIX: &str = ".awareness-new-";

/// Whether `name` is one [`create`] gives a store while preparing it.
#[cfg(unix)]
fn is_staged_name(name: &std::ffi::OsStr) -> bool {
    let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(STAGED_PREFIX)) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    rest.split_once('-')
        .is_some_and(|(pid, n)| digits(pid) && digits(n))
}

/// Refuses a database file that has other names (hard links). SQLite keeps a database's
/// write-ahead log and its index beside the name it was opened under, so two connections that
/// open one file under two names keep two logs, each checkpointed into the file over the
/// other's pages: the file is corrupted, and no lock prevents it (the locks are the file's, the
/// logs are not). Another name may be a backup made with hard links, or a link made by hand.
///
/// The names [`create`] gives a store while preparing it are not counted: one is linked at
/// `path` for a moment before it is removed, and a process killed in that moment leaves it
/// there for good; nothing opens a store under such a name. The names are looked for beside
/// the file itself (a symbolic link at `path` resolved, as SQLite resolves it), and those found
/// are given in the error; a name in another directory cannot be found from here.
#[cfg(unix)]
fn refuse_other_names(path: &Path, m: &std::fs::Metadata) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt as _;
    if m.nlink() <= 1 {
        return Ok(());
    }
    let real = resolved(path);
    let dir = parent(&real);
    let same_file = |e: &std::fs::Metadata| e.dev() == m.dev() && e.ino() == m.ino();
    // The names beside the file: how many are prepared names, and the others. A store being
    // created by another opener has its prepared name for a moment, so the listing is taken
    // between two looks at the link count and taken again (a few times at most) until both
    // looks agree: the count and the listing are then of one moment.
    let mut links = m.nlink();
    let mut looks = 0;
    let (staged, beside, listed) = loop {
        let mut staged = 0u64;
        let mut beside = Vec::new();
        let listed = std::fs::read_dir(dir).map(|entries| {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if Some(name.as_os_str()) == real.file_name()
                    || !entry.metadata().is_ok_and(|e| same_file(&e))
                {
                    continue;
                }
                if is_staged_name(&name) {
                    staged += 1;
                } else {
                    beside.push(name.to_string_lossy().into_owned());
                }
            }
        });
        let again = std::fs::metadata(path)
            .ok()
            .filter(|again| same_file(again))
            .map_or(links, |again| again.nlink());
        looks += 1;
        if again == links || looks == 4 {
            // Still changing after four listings: the fewer names count.
            links = links.min(again);
            break (staged, beside, listed);
        }
        links = again;
    };
    let others = links.saturating_sub(1).saturating_sub(staged);
    if others == 0 {
        return Ok(());
    }
    let mut beside = beside;
    beside.sort();
    let elsewhere = others.saturating_sub(beside.len() as u64);
    let dir = dir.display();
    let found = match (listed, beside.is_empty(), elsewhere) {
        (Err(e), ..) => format!(" ({dir} cannot be listed to name them: {e})"),
        (Ok(()), true, _) => format!(" (none in {dir})"),
        (Ok(()), false, 0) => format!(" ({} in {dir})", beside.join(", ")),
        (Ok(()), false, n) => format!(" ({} in {dir}, and {n} elsewhere)", beside.join(", ")),
    };
    Err(error::open(
        path,
        OpenFailure::Other,
        format!(
            "the file has {others} other name{} (hard links){found}: SQLite keeps the write-ahead log beside the name a database is opened under, so two processes opening it under two names would each keep a log of their own and corrupt the file; remove the other names (or copy the file rather than link it) and open it under one",
            if others == 1 { "" } else { "s" }
        ),
        None,
    ))
}

/// The path of the file itself: a symbolic link at `path` resolved, as SQLite's Unix layer
/// resolves it before it names the `-wal` and `-shm` files; `path` itself when it cannot be
/// resolved (a file not there yet). Elsewhere SQLite names them after `path` as given.
fn resolved(path: &Path) -> PathBuf {
    #[cfg(unix)]
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    path.to_path_buf()
}

/// Hard links cannot be counted here: nothing to refuse.
#[cfg(not(unix))]
#[allow(clippy::unnecessary_wraps)]
fn refuse_other_names(_path: &Path, _m: &std::fs::Metadata) -> Result<(), StoreError> {
    Ok(())
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates a new store at `path`, complete (WAL mode, the schema) before any other opener can
/// see it, or answers `false` when something got there first (another opener's store, which
/// the caller then opens; or anything else, which the caller's open then refuses, as it would
/// have before).
///
/// Why this way: a failed open must not leave a new file behind, but it must not remove a file
/// another opener may be using either, and of a file at `path` that can never be known. Two
/// opens of a new path at once show it: one creates the file, the other finds it and opens it,
/// and the creator, should its own preparation then fail, would remove a file the other is
/// writing to (which then goes on writing into a deleted file); and no lock closes the gap,
/// since the other may hold the file open before it takes any lock. So the store is prepared
/// under a name of this open's own in the same directory, which no other opener knows: a
/// failure there removes that file and its companions, and leaves nothing behind. Only a
/// complete store is then linked at `path` (a hard link, which fails when anything is there
/// already, so nothing is ever overwritten), and from then on it is never removed, whatever
/// happens to this open afterwards (the store is complete, and others may be using it). The
/// prepared name (`.awareness-new-<pid>-<n>`) is removed either way, also when the open is
/// cancelled; a process killed while preparing leaves it beside the store, and nothing reads it.
///
/// On a file system without hard links, the file is created empty at `path` instead and the
/// open prepares it there, as before; for the reason above, a failed open then leaves it (an
/// empty file, which the next open makes a store, as it does any empty file).
async fn create(path: &Path, connect: &SqliteConnectOptions) -> Result<bool, StoreError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // A write-ahead log, its shared-memory index or a rollback journal beside a path that
    // holds no database (its database deleted after a process was killed before folding the
    // log back or rolling the journal back, or while one still has it open): SQLite would read
    // it into the new store as that store's own pages (a journal whose first byte is not zero,
    // SQLite's test of a live one, is played back over any database file that is not empty,
    // and the new store is complete before SQLite first opens it at `path`). A log counts even
    // when empty, and so does an index alone: a process that still has the deleted database
    // open has them (the log empty until it writes), and the new store would share them with
    // it, each reading the other's pages as its own, the index telling where. A journal left
    // zeroed or empty (`journal_mode=PERSIST` or `TRUNCATE`) is ignored by SQLite, and here.
    // The path is looked at after them: another opener creating the store at the same moment
    // links it there before its log or index exists, so neither is taken for a stray one.
    // A test's pause point, as a new store's creation begins (compiled in tests only; a helper
    // of the test `a_store_another_opener_made_meanwhile_is_opened`, review of stop 67).
    #[cfg(test)]
    crate::tests::CREATING.at(path).await;
    refuse_stray_companions(path, path, "no database is there", true, || {
        std::fs::symlink_metadata(path).is_err()
    })?;
    let cannot_create = |e: std::io::Error| {
        error::open(
            path,
            OpenFailure::of_io(&e),
            "cannot create it",
            Some(Box::new(e)),
        )
    };
    let staged = Staged(loop {
        // A short name of its own, whatever the length of the store's (SQLite adds `-journal`
        // to it, and a file name has at most 255 bytes).
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let staged = parent(path).join(format!("{STAGED_PREFIX}{}-{n}", std::process::id()));
        match create_private(&staged) {
            Ok(_) => break staged,
            // A name an earlier process with the same id left: take the next one.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(cannot_create(e)),
        }
    });
    if let Err(e) = prepare_staged(&staged.0, connect).await {
        return Err(error::failed_create(path, e));
    }
    let linked = std::fs::hard_link(&staged.0, path);
    drop(staged);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot link the new store into place; creating it in place");
            match create_private(path) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(cannot_create(e)),
            }
        }
    }
}

/// Refuses to make a store at `path`, where no database is (`state` says how: missing, or
/// empty), when a write-ahead log, its index or a live journal is beside the file `beside`
/// (`path`, its symbolic link resolved) ([`create`] says why); the journal only with
/// `journal`. `still` tells, once they have been looked at, whether `path` is still as it was:
/// another opener creating the store at the same moment puts it there before its log or index
/// exists, so neither is taken for a stray one.
fn refuse_stray_companions(
    path: &Path,
    beside: &Path,
    state: &str,
    journal: bool,
    still: impl Fn() -> bool,
) -> Result<(), StoreError> {
    for (suffix, what) in [
        ("-wal", "write-ahead log"),
        ("-shm", "write-ahead log's shared-memory index"),
        ("-journal", "rollback journal"),
    ] {
        if suffix == "-journal" && !journal {
            continue;
        }
        let left = companion(beside, suffix);
        let live = if suffix == "-journal" {
            first_byte_set(&left)
        } else {
            std::fs::symlink_metadata(&left).is_ok()
        };
        if live && still() {
            return Err(error::open(
                path,
                OpenFailure::Other,
                format!(
                    "{state}, but a {what} ({}) is beside it, left by a database that was deleted or moved (after a process was killed, while one still has it open, or after a read-only handle closed last, which cannot remove it): SQLite would read it into a new store, or take it from the process that has it; move it (and any -wal or -shm) away first, once no process has the old database open",
                    left.display()
                ),
                None,
            ));
        }
    }
    Ok(())
}

/// Whether the file at `path` can be read and its first byte is not zero.
fn first_byte_set(path: &Path) -> bool {
    use std::io::Read as _;
    let mut first = [0u8; 1];
    std::fs::File::open(path).is_ok_and(|mut f| f.read_exact(&mut first).is_ok() && first[0] != 0)
}

/// Writes the schema, then switches to WAL, in the file `staged` nobody else knows. In that
/// order everything is in the file itself when the connection closes, and nothing in a `-wal`
/// beside it (which keeps the staged name and is not linked).
async fn prepare_staged(staged: &Path, connect: &SqliteConnectOptions) -> Result<(), sqlx::Error> {
    let mut conn = connect
        .clone()
        .filename(crate::file_name(staged))
        .connect()
        .await?;
    let prepared = async {
        schema::migrate(&mut conn, staged, Timestamp::now().millis()).await?;
        sqlx::raw_sql(sql::WRITER_PRAGMAS)
            .execute(&mut conn)
            .await
            .map(drop)
    }
    .await;
    let closed = conn.close().await;
    prepared.and(closed)
}

/// The staged file of [`create`] and its companions, removed when dropped: when the store is
/// linked into place, when preparing it fails, and when the open is cancelled meanwhile.
struct Staged(PathBuf);

impl Drop for Staged {
    fn drop(&mut self) {
        remove_staged(&self.0);
    }
}

/// Removes the staged file and whatever SQLite created beside it: the companions first and
/// the file last, since the file (created exclusively) is what keeps its name this open's.
fn remove_staged(staged: &Path) {
    for suffix in ["-journal", "-wal", "-shm", ""] {
        let p = companion(staged, suffix);
        if let Err(e) = std::fs::remove_file(&p)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %p.display(), error = %e, "cannot remove a file an open staged");
        }
    }
}

#[cfg(unix)]
fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}
