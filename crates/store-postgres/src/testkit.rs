//! Test support (feature `testkit`) for the crates that test or measure against a PostgreSQL
//! server: the server `AWARENESS_PG_URL` names, and schemas no other test uses, dropped when
//! the test is done with them. Not for production use.
//!
//! `.ci/postgres` starts a server and prints its URL; without the variable every helper here
//! panics naming it, so that a backend that is not tested is not skipped quietly.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{PgConnectOptions, PgStoreOptions};

/// The variable that names the server.
pub const SERVER_VAR: &str = "AWARENESS_PG_URL";

/// The server's URL, as the variable gives it.
///
/// # Panics
///
/// When the variable is not set.
pub fn server_url() -> String {
    std::env::var(SERVER_VAR).unwrap_or_else(|_| {
        panic!(
            "{SERVER_VAR} names the PostgreSQL server the postgres tests and benches use (for \
             example postgres:///awareness_test?host=/var/run/postgresql); \
             `export {SERVER_VAR}=\"$(bash .ci/postgres)\"` starts one, and .ci/run does"
        )
    })
}

/// The server, as [`crate::parse_url`] reads [`server_url`] (a `schema=` in it is ignored).
///
/// # Panics
///
/// When the variable is not set or sqlx cannot read it.
pub fn server() -> PgConnectOptions {
    crate::parse_url(&server_url())
        .unwrap_or_else(|e| panic!("{SERVER_VAR}: {e}"))
        .0
}

/// `<prefix>_<process id>_<counter>_<clock>`: a schema name no other test of any run uses
/// (`prefix` of lowercase letters, digits and `_`, the name then needing no quoting).
pub fn fresh_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos % 1_000_000_000_000
    )
}

/// A schema of the server, dropped (`DROP SCHEMA ... CASCADE`, with everything in it) when
/// this is. Nothing is created until a store is opened in it.
#[derive(Debug)]
pub struct Schema(pub String);

impl Schema {
    /// A schema of a [`fresh_name`].
    pub fn fresh(prefix: &str) -> Self {
        Self(fresh_name(prefix))
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The store URL of this schema: [`server_url`] with `schema=` added to its query.
    pub fn url(&self) -> String {
        let server = server_url();
        let sep = if server.contains('?') { '&' } else { '?' };
        format!("{server}{sep}schema={}", self.0)
    }

    /// The store's options for this schema.
    pub fn options(&self) -> PgStoreOptions {
        PgStoreOptions::new(self.0.clone())
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        // Without the server's variable nothing can have been made in the schema: a guard made
        // before a connection that panicked for want of it (the scale example's) would panic
        // again here, while unwinding, and abort the process.
        if std::env::var_os(SERVER_VAR).is_none() {
            return;
        }
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.0);
        on_server(
            &format!("dropping the test schema {}", self.0),
            async move |conn| {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(conn)
                    .await
                    .map(drop)
            },
        );
    }
}

/// Runs `work` on a connection of its own to the server, on a thread and a runtime of its own
/// (the caller's may be busy, paused or gone), and waits for it. Best effort, for clean-ups: a
/// failure is printed after `what`, and only costs what was to be cleaned up.
///
/// # Panics
///
/// When [`SERVER_VAR`] is not set.
pub fn on_server<W>(what: &str, work: W)
where
    W: AsyncFnOnce(&mut sqlx::PgConnection) -> Result<(), sqlx::Error> + Send + 'static,
{
    let server = server();
    let done = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(sqlx::Error::Io)?
            .block_on(async move {
                use sqlx::{ConnectOptions as _, Connection as _};
                let mut conn = server.connect().await?;
                work(&mut conn).await?;
                conn.close().await
            })
    })
    .join();
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("{what}: {e}"),
        Err(_) => eprintln!("{what}: panicked"),
    }
}

/// The store's lock on the schema `schema`, held by a session of its own, as another gateway
/// in the middle of a write holds it: every write of every handle on that store waits until
/// [`StoreLock::release`].
#[derive(Debug)]
pub struct StoreLock {
    conn: sqlx::PgConnection,
    key: i64,
}

impl StoreLock {
    /// Takes the lock of the store in `schema` (waits while another holds it).
    ///
    /// # Panics
    ///
    /// When the server cannot be reached.
    pub async fn take(schema: &str) -> Self {
        use sqlx::ConnectOptions as _;
        let mut conn = server().connect().await.expect("connect to hold the lock");
        let key = crate::schema::lock_key(schema);
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut conn)
            .await
            .expect("take the store's lock");
        Self { conn, key }
    }

    /// Lets the lock go and closes the session.
    ///
    /// # Panics
    ///
    /// When the server cannot be reached.
    pub async fn release(mut self) {
        use sqlx::Connection as _;
        let released: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
            .bind(self.key)
            .fetch_one(&mut self.conn)
            .await
            .expect("release the store's lock");
        assert!(released, "the lock was held");
        self.conn.close().await.expect("close the holder");
    }
}
