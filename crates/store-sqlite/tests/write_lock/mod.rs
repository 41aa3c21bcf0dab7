//! Another connection holding a store file's write lock, as another process would: for the
//! tests in which the store, or an open, meets that lock.

use std::path::Path;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions as _, Connection as _};

/// A connection of its own holding the write lock of a file (`BEGIN IMMEDIATE`).
pub struct WriteLock(SqliteConnection);

impl WriteLock {
    /// Takes the write lock of the file at `path`.
    pub async fn take(path: &Path) -> Self {
        let mut conn = SqliteConnectOptions::new()
            .filename(path)
            .connect()
            .await
            .expect("a connection of its own");
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .expect("take the write lock");
        Self(conn)
    }

    /// Lets the lock go (its transaction wrote nothing) and closes the connection.
    pub async fn release(mut self) {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut self.0)
            .await
            .expect("let the write lock go");
        self.0.close().await.expect("close the connection");
    }
}
