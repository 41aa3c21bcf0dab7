//! A PostgreSQL store opened by URL, as a gateway opens any store: each test in a schema of its
//! own on the server `AWARENESS_PG_URL` names (`.ci/run` starts one), dropped when it is done.
//! Without that variable these tests fail, naming it: a backend that is not tested is not
//! skipped quietly.
#![cfg(feature = "postgres")]

use awareness_core::{
    ActorType, AwarenessStoreExt as _, EventKind, NewEvent, OpenFailure, Sequence, SessionRef,
    StoreError, Timestamp,
};
use gateway_adapter::{OpenError, OpenOptions, open_full_store_with, open_store};
use sqlx::{ConnectOptions as _, Connection as _};

use store_postgres::testkit::Schema;

/// A schema no other test of any run uses (its URL's `schema=`), and the guard that drops it.
fn fresh_schema() -> (String, Schema) {
    let schema = Schema::fresh("ga");
    (schema.name().to_owned(), schema)
}

/// The store URL of `schema` on the server.
fn url_of(schema: &str) -> String {
    let server = store_postgres::testkit::server_url();
    let sep = if server.contains('?') { '&' } else { '?' };
    format!("{server}{sep}schema={schema}")
}

/// A connection of its own to the server.
async fn raw() -> sqlx::PgConnection {
    store_postgres::testkit::server()
        .connect()
        .await
        .expect("connect to the server")
}

/// The tables `schema` holds (`None` when there is no such schema).
async fn tables_in(schema: &str) -> Option<Vec<String>> {
    let mut conn = raw().await;
    let found: Option<Vec<String>> = sqlx::query_scalar(
        "SELECT array(SELECT c.relname::text FROM pg_class c
                      WHERE c.relnamespace = n.oid AND c.relkind = 'r' ORDER BY 1)
         FROM pg_namespace n WHERE n.nspname = $1",
    )
    .bind(schema)
    .fetch_optional(&mut conn)
    .await
    .expect("read the catalog");
    conn.close().await.expect("closed");
    found
}

fn human(session: &SessionRef) -> NewEvent {
    NewEvent::new(
        session.clone(),
        EventKind::HumanDirectMessage,
        ActorType::Human,
        "human message via telegram",
    )
}

/// No creation allowed, as a tool that must not make a store asks.
const EXISTING: OpenOptions = OpenOptions {
    create_if_missing: false,
    read_only: false,
    live_readers: false,
};

/// `open_store` creates the store in its schema; what it recorded is there when the URL is
/// opened again (a restart), by `open_store` or by an open that may not create a store, which
/// live readers do not change (PostgreSQL lets every connection in).
#[tokio::test]
async fn open_store_opens_a_postgres_store_that_a_reopen_finds() {
    let (schema, _drop) = fresh_schema();
    let url = url_of(&schema);
    assert_eq!(tables_in(&schema).await, None, "a fresh schema");
    let store = open_store(&url)
        .await
        .unwrap_or_else(|e| panic!("open {url}: {e}"));
    let child = SessionRef::parse("agent:main:subagent:child", "main").unwrap();
    let recorded = store
        .record(human(&child), Timestamp::now())
        .await
        .expect("recorded");
    store.close().await;
    let tables = tables_in(&schema).await.expect("the schema was created");
    for t in ["session_state_events", "session_state_heads"] {
        assert!(tables.iter().any(|x| x == t), "{t} in {tables:?}");
    }

    let again = open_store(&url).await.expect("reopened");
    let status = again
        .session_status(&child, Some(Sequence(0)), None)
        .await
        .expect("status");
    assert_eq!(status.state_version, recorded.event.sequence);
    again.close().await;

    for live_readers in [false, true] {
        let full = open_full_store_with(
            &url,
            OpenOptions {
                live_readers,
                ..EXISTING
            },
        )
        .await
        .expect("an existing store opens without creating");
        let heads = full
            .heads(std::slice::from_ref(&child))
            .await
            .expect("heads");
        assert_eq!(heads.len(), 1, "{live_readers}");
        assert_eq!(
            heads[0].last_sequence, recorded.event.sequence,
            "{live_readers}"
        );
        full.close().await;
    }
}

/// An open that may not create a store refuses a schema that is missing, or that holds no
/// store (another application's tables), and creates nothing in either; an open that may
/// create one then makes the store in that schema beside what it held.
#[tokio::test]
async fn an_open_that_may_not_create_refuses_a_schema_without_a_store() {
    let (schema, _drop) = fresh_schema();
    let url = url_of(&schema);
    let refusal = |got: Result<_, OpenError>| match got {
        Ok(_) => panic!("opened"),
        Err(OpenError::Store(e @ StoreError::Open { .. })) => e,
        Err(e) => panic!("{e:?}"),
    };

    let missing = refusal(open_full_store_with(&url, EXISTING).await);
    assert_eq!(
        missing.open_failure(),
        Some(OpenFailure::NotFound),
        "{missing}"
    );
    assert!(missing.to_string().contains(&schema), "{missing}");
    assert_eq!(tables_in(&schema).await, None, "no schema was created");

    let mut conn = raw().await;
    for sql in [
        format!("CREATE SCHEMA \"{schema}\""),
        format!("CREATE TABLE \"{schema}\".orders (id int)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("another application's schema");
    }
    conn.close().await.expect("closed");
    // No store there yet: an open that may create adds one beside the other tables (below).
    let foreign = refusal(open_full_store_with(&url, EXISTING).await);
    assert_eq!(
        foreign.open_failure(),
        Some(OpenFailure::NotFound),
        "{foreign}"
    );
    assert!(
        foreign.to_string().contains("session_state_events"),
        "{foreign}"
    );
    assert_eq!(
        tables_in(&schema).await,
        Some(vec!["orders".to_owned()]),
        "nothing was added to it"
    );

    let store = open_full_store_with(&url, OpenOptions::default())
        .await
        .expect("an open that may create makes the store there");
    store.close().await;
    let tables = tables_in(&schema).await.expect("the schema");
    assert!(
        tables.len() > 1 && tables.contains(&"orders".to_owned()),
        "{tables:?}"
    );
}

/// A schema name the store cannot take is the store's own typed refusal through the adapter,
/// also from an open that may not create a store (which looks for the schema first: such a
/// name is a mistake in the URL, not a store that is missing); nothing is created.
#[tokio::test]
async fn a_bad_schema_name_is_the_stores_refusal() {
    let too_long = "s".repeat(64);
    for bad in ["Upper", "1digit", "a-b", too_long.as_str()] {
        let url = url_of(bad);
        for options in [OpenOptions::default(), EXISTING] {
            let err = open_full_store_with(&url, options)
                .await
                .expect_err("refused");
            let OpenError::Store(e) = &err else {
                panic!("{bad}: {err:?}")
            };
            assert_eq!(
                e.open_failure(),
                Some(OpenFailure::InvalidOptions),
                "{bad} {options:?}: {e}"
            );
            assert!(e.to_string().contains("schema name"), "{bad}: {e}");
        }
        assert_eq!(tables_in(bad).await, None, "{bad}: nothing created");
    }
}
