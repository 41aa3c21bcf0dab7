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
