//! The server the tests use, and a fresh schema for each store they open. Each test binary
//! uses part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use store_postgres::{PgConnectOptions, PgStore, PgStoreOptions};

/// The server the tests connect to: `AWARENESS_PG_URL` (`.ci/run` sets it and starts the
/// server). Without it the tests fail, naming it: a backend that is not tested is not skipped
/// quietly.
pub fn server() -> PgConnectOptions {
    let url = std::env::var("AWARENESS_PG_URL").expect(
        "AWARENESS_PG_URL names the PostgreSQL server the store-postgres tests use \
         (for example postgres:///awareness_test?host=/var/run/postgresql); .ci/run starts one",
    );
    url.parse()
        .unwrap_or_else(|e| panic!("AWARENESS_PG_URL {url:?} is not a connection URL: {e}"))
}

/// A schema name no other test of any run uses.
pub fn fresh_schema() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "t_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos % 1_000_000_000_000
    )
}

/// Drops its schema when the test is done with it.
pub struct DropSchema(pub String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        let schema = std::mem::take(&mut self.0);
        // A runtime of its own, on a thread of its own: the test's may be gone or busy.
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop a schema")
                .block_on(async move {
                    use sqlx::ConnectOptions as _;
                    let mut conn = server().connect().await?;
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                    )))
                    .execute(&mut conn)
                    .await
                    .map(drop)
                })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("dropping a test schema: {e}");
        }
    }
}

/// A store in a fresh schema, and the guard that drops the schema.
pub async fn fresh_store() -> (PgStore, DropSchema) {
    let schema = fresh_schema();
    let (store, _) = fresh_store_in(&schema).await;
    (store, DropSchema(schema))
}

/// A store in the schema `schema` (created), and its name; the caller drops the schema.
pub async fn fresh_store_in(schema: &str) -> (PgStore, String) {
    let store = PgStore::connect(server(), PgStoreOptions::new(schema))
        .await
        .expect("connect a fresh store");
    (store, schema.to_owned())
}
