//! Opening: checking the path, creating a missing file with mode 0600, preparing the write
//! connection, and leaving nothing behind when a damaged file is refused.

use std::path::{Path, PathBuf};

use awareness_core::{StoreError, Timestamp};
use sqlx::SqliteConnection;

use crate::{SqliteOptions, error, schema, sql};

/// WAL mode (persistent in the file), then the schema.
pub(crate) async fn init_writer(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sql::WRITER_PRAGMAS)
        .execute(&mut *conn)
        .await?;
    schema::migrate(conn, Timestamp::now().millis()).await
}

/// SQLite's `-wal` and `-shm` files of a database, and whether they existed before we opened
/// it: reading a damaged WAL-mode file makes SQLite create them before it notices the damage.
pub(crate) struct Companions {
    paths: [PathBuf; 2],
    existed: [bool; 2],
}

impl Companions {
    pub(crate) fn before_open(path: &Path) -> Self {
        let paths = ["-wal", "-shm"].map(|suffix| {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            PathBuf::from(p)
        });
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

/// Checks the path and creates a missing file with mode 0600. Returns whether it created it.
pub(crate) fn prepare_file(path: &Path, options: &SqliteOptions) -> Result<bool, StoreError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(false),
        Ok(_) => Err(error::open(path, "it is not a regular file", None)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if options.read_only || !options.create_if_missing {
                return Err(error::open(
                    path,
                    "the file does not exist",
                    Some(Box::new(e)),
                ));
            }
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !parent.is_dir() {
                return Err(error::open(
                    path,
                    format!("its directory {} does not exist", parent.display()),
                    None,
                ));
            }
            create_private(path)
        }
        Err(e) => Err(error::open(
            path,
            format!("cannot inspect it: {e}"),
            Some(Box::new(e)),
        )),
    }
}

#[cfg(unix)]
fn create_private(path: &Path) -> Result<bool, StoreError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let res = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    created(path, res)
}

#[cfg(not(unix))]
fn create_private(path: &Path) -> Result<bool, StoreError> {
    let res = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path);
    created(path, res)
}

fn created(path: &Path, res: std::io::Result<std::fs::File>) -> Result<bool, StoreError> {
    match res {
        Ok(_) => Ok(true),
        // Another process created it in the meantime: open what is there.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(error::open(
            path,
            format!("cannot create it: {e}"),
            Some(Box::new(e)),
        )),
    }
}

/// Removes a file this open created (and SQLite's companions) after the open failed.
pub(crate) fn remove_created(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let p = PathBuf::from(p);
        if let Err(e) = std::fs::remove_file(&p)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %p.display(), error = %e, "cannot remove a file a failed open created");
        }
    }
}
