//! The server the tests use, and a fresh schema for each store they open
//! (`store_postgres::testkit`). Each test binary uses part of it.
#![allow(dead_code, unused_imports)]

use store_postgres::testkit::Schema;
use store_postgres::{PgStore, PgStoreOptions};

pub use store_postgres::testkit::{Schema as DropSchema, server};

/// A schema name no other test of any run uses.
pub fn fresh_schema() -> String {
    store_postgres::testkit::fresh_name("t")
}

/// The test server's database reached over TCP as `role` (password `pw`).
pub fn as_role(role: &str) -> store_postgres::PgConnectOptions {
    let admin = server();
    store_postgres::PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(admin.get_port())
        .database(admin.get_database().expect("the test URL names a database"))
        .username(role)
        .password("pw")
}

/// A role of the server, dropped (with its grants: `DROP OWNED BY`, then `DROP ROLE`) when
/// this is, whatever the test did meanwhile. Best effort, as the schema guard's drop is.
pub struct DropRole(pub String);

impl DropRole {
    /// Makes the role `role` on the test server (`LOGIN PASSWORD 'pw'`, then `attributes`),
    /// dropped with the answer.
    pub async fn create(role: String, attributes: &str) -> Self {
        run_as_admin(&format!(
            "CREATE ROLE \"{role}\" LOGIN PASSWORD 'pw' {attributes}"
        ))
        .await;
        Self(role)
    }

    /// Lets the role read and write the rows of the store in `schema`, and nothing more: what
    /// a gateway's role needs.
    pub async fn may_use_rows_of(&self, schema: &str) {
        let role = &self.0;
        run_as_admin(&format!("GRANT USAGE ON SCHEMA \"{schema}\" TO \"{role}\"")).await;
        run_as_admin(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{schema}\" TO \"{role}\""
        ))
        .await;
    }
}

/// Runs `sql` on the test server as its own role.
pub async fn run_as_admin(sql: &str) {
    use sqlx::ConnectOptions as _;
    let mut conn = server().connect().await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

impl Drop for DropRole {
    fn drop(&mut self) {
        let role = self.0.clone();
        store_postgres::testkit::on_server(
            &format!("dropping the test role {role}"),
            async move |conn| {
                for sql in [
                    format!("DROP OWNED BY \"{role}\""),
                    format!("DROP ROLE \"{role}\""),
                ] {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            },
        );
    }
}

/// A store in a fresh schema, and the guard that drops the schema.
pub async fn fresh_store() -> (PgStore, Schema) {
    let schema = Schema::fresh("t");
    let (store, _) = fresh_store_in(schema.name()).await;
    (store, schema)
}

/// A store in the schema `schema` (created), and its name; the caller drops the schema.
pub async fn fresh_store_in(schema: &str) -> (PgStore, String) {
    let store = PgStore::connect(server(), PgStoreOptions::new(schema))
        .await
        .expect("connect a fresh store");
    (store, schema.to_owned())
}

/// The schema the durable and group-commit suites' `path` names: `d_<pid>_<hash of the
/// path>`, so that opening the same path again opens the same store. The schema outlives the
/// handle (a later open of the path must find it): it is dropped by the call for another path
/// once the check's scratch directory, which holds the path, is gone. The last checks' schemas
/// stay behind when the process ends (nothing runs then); the first call of the next test
/// process drops those of every process that has ended ([`drop_schemas_of_ended_processes`]).
pub fn schema_of_path(path: &std::path::Path) -> String {
    static SCHEMAS: std::sync::Mutex<Vec<(std::path::PathBuf, Option<DropSchema>)>> =
        std::sync::Mutex::new(Vec::new());
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(drop_schemas_of_ended_processes);
    let hash = awareness_core::upstream::fnv1a64(path.as_os_str().as_encoded_bytes());
    let schema = format!("d_{}_{hash:016x}", std::process::id());
    let done: Vec<DropSchema> = {
        let mut schemas = SCHEMAS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !schemas.iter().any(|(p, _)| p == path) {
            schemas.push((path.to_owned(), Some(DropSchema(schema.clone()))));
        }
        schemas
            .iter_mut()
            .filter(|(p, _)| p.parent().is_some_and(|dir| !dir.exists()))
            .filter_map(|(_, s)| s.take())
            .collect()
    };
    drop(done);
    schema
}

/// How the model test and the durable suite make `store` (in `schema`) batch a wave of
/// recordings: another gateway takes the store's lock ([`store_postgres::testkit::StoreLock`]),
/// then a write that changes nothing (an unwatch of a cursor no test makes) takes the handle's
/// turn, polled once so that it is first in line, and waits on that lock. The recordings given
/// to the store meanwhile queue behind it. Released, the lock lets the unwatch through, and the
/// first recording to get the turn then takes every queued event into one batch.
pub fn batching(
    store: std::sync::Arc<PgStore>,
    schema: String,
) -> awareness_core::testkit::model::Batching {
    let (measured, counted) = (std::sync::Arc::clone(&store), std::sync::Arc::clone(&store));
    awareness_core::testkit::model::Batching {
        hold_writer: Box::new(move || {
            Box::pin(hold_writer(std::sync::Arc::clone(&store), schema.clone()))
        }),
        largest_batch: Box::new(move || measured.largest_batch()),
        write_transactions: Box::new(move || counted.write_transactions()),
        // The unwatch queued first in line.
        hold_transactions: 1,
        given_up: awareness_core::testkit::model::GivenUp::LeavesTheQueue,
    }
}

async fn hold_writer(
    store: std::sync::Arc<PgStore>,
    schema: String,
) -> awareness_core::testkit::model::Release {
    let lock = store_postgres::testkit::StoreLock::take(&schema).await;
    awareness_core::testkit::model::Release::behind_a_noop_write(store, lock.release()).await
}

/// Drops the schemas `d_<pid>_<hash>` ([`schema_of_path`]) of the test processes of this
/// machine that have ended (`/proc/<pid>` gone): the ones the last checks of each process left.
/// A process still running keeps its own. Best effort (`on_server`).
fn drop_schemas_of_ended_processes() {
    let what = "dropping the schemas of ended test processes";
    store_postgres::testkit::on_server(what, async |conn| {
        let names: Vec<String> =
            sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'd\\_%'")
                .fetch_all(&mut *conn)
                .await?;
        for name in names {
            let Some(pid) = name
                .split('_')
                .nth(1)
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            let alive =
                pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists();
            if !alive {
                let sql = format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut *conn)
                    .await?;
            }
        }
        Ok(())
    });
}
