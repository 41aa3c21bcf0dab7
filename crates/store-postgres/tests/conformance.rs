//! store-postgres runs the shared conformance suite and the model test, each check in a schema
//! of its own on the server `AWARENESS_PG_URL` names (`.ci/run` starts one; see README.md).

mod server;

use std::sync::Arc;

use awareness_core::testkit::Subject;
use store_postgres::PgStore;

awareness_core::raw_access_forwarding!(PgStore);

async fn subject() -> Subject {
    let (store, guard) = server::fresh_store().await;
    let store = Arc::new(store);
    Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(Arc::clone(&store))),
        batching: Some(server::batching(
            Arc::clone(&store),
            guard.name().to_owned(),
        )),
        guard: Box::new(guard),
    }
}

awareness_core::conformance_suite!(subject, foreign_commits: Counted);
awareness_core::model_test!(subject);
