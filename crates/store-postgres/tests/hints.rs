//! Commit hints through `LISTEN`/`NOTIFY` (`EventStore::commit_hints`, DESIGN.md section 9.1):
//! a handle is told of another handle's commit to its store, not of its own, not of another
//! store's in the same database, and after its listening connection is lost, of what it may
//! have missed, a loss the network never told it of included. (That another handle's commit is hinted at all, and that a stream ends with its
//! store, is the durable suite's `another_handles_commit_is_hinted`, which tests/durable.rs
//! runs.)

mod server;

use std::time::Duration;

use awareness_core::testkit::group_commit::{T0, event};
use awareness_core::{CommitHints, CursorStore as _, EventStore as _};
use store_postgres::{PgStore, PgStoreOptions};

/// Longest wait for a hint that must come (a notification is delivered at the commit).
const WAIT: Duration = Duration::from_secs(30);

async fn hinted(hints: &mut Box<dyn CommitHints>) {
    let next = tokio::time::timeout(WAIT, hints.next())
        .await
        .expect("a hint within the wait");
    assert!(next, "the store is still open");
}

/// Handles `ours` and `theirs` on one fresh schema, and a handle on another.
async fn three_handles() -> (PgStore, PgStore, PgStore, [server::DropSchema; 2]) {
    let (one, two) = (server::fresh_schema(), server::fresh_schema());
    let guards = [
        server::DropSchema(one.clone()),
        server::DropSchema(two.clone()),
    ];
    let (ours, _) = server::fresh_store_in(&one).await;
    let (theirs, _) = server::fresh_store_in(&one).await;
    let (elsewhere, _) = server::fresh_store_in(&two).await;
    (ours, theirs, elsewhere, guards)
}

/// Waits until `done` holds (checked every 10 ms, at most for [`WAIT`]).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(WAIT, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what} within the wait");
}

/// The listener gives one hint once it listens (for the commits made since it was asked, which
/// its connection's `LISTEN` came too late for), to the streams made before; a stream made
/// after it does not get it, and no other hint comes without another handle's commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_hints_once_when_it_begins_to_listen() {
    let (ours, _theirs, _elsewhere, _drop) = three_handles().await;
    let mut hints = ours.commit_hints().expect("store-postgres pushes hints");
    ours.hints_listening().await;
    let mut later = ours.commit_hints().expect("store-postgres pushes hints");
    hinted(&mut hints).await;
    let early = awareness_core::testkit::poll_once(std::pin::pin!(later.next())).await;
    assert!(
        !early,
        "the start's hint is not given to a stream made after it"
    );
    ours.record(event(1), T0).await.expect("record ours");
    until("its own commit left out", || {
        ours.own_commits_left_out() == 1
    })
    .await;
    assert_eq!(ours.hints_given(), 1, "no hint without another's commit");
}

/// Another handle's commit on the same store is hinted; the handle's own commits and another
/// schema's store's are not. Notifications come in commit order: once the listener has left
/// out the handle's own commit made last, it has seen every one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_handles_commit_is_hinted_and_its_own_and_another_stores_are_not() {
    let (ours, theirs, elsewhere, _drop) = three_handles().await;
    let mut hints = ours.commit_hints().expect("store-postgres pushes hints");
    ours.hints_listening().await;
    hinted(&mut hints).await;
    assert_eq!(ours.hints_given(), 1, "the start's");

    for i in 0..3 {
        elsewhere
            .record(event(i), T0)
            .await
            .expect("record elsewhere");
    }
    theirs.record(event(3), T0).await.expect("record theirs");
    hinted(&mut hints).await;
    ours.record(event(4), T0).await.expect("record ours");
    until("its own commit left out", || {
        ours.own_commits_left_out() == 1
    })
    .await;
    assert_eq!(ours.hints_given(), 2, "the start's and theirs only");

    // A write other than a recording (here a watch) hints too.
    let watcher = awareness_core::WatcherKey::parse("agent:main:main").expect("watcher");
    theirs
        .watch(&watcher, &event(3).session, T0)
        .await
        .expect("watch");
    hinted(&mut hints).await;
    ours.record(event(5), T0).await.expect("record ours");
    until("its own commit left out", || {
        ours.own_commits_left_out() == 2
    })
    .await;
    assert_eq!(ours.hints_given(), 3);
}

/// A listener whose connection the server ends listens again on a new one, and hints once for
/// whatever was committed meanwhile; later commits are hinted as before. The loss is warned of,
/// naming the store's schema (it was logged at debug level: a connection the server kept
/// ending was seen nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_listening_connection_is_listened_on_again_with_a_hint() {
    let logs = awareness_core::testkit::logs::Capture::warnings();
    let (ours, theirs, _elsewhere, schemas) = three_handles().await;
    let schema = format!("schema={}", schemas[0].0);
    let mut hints = ours.commit_hints().expect("store-postgres pushes hints");
    let first = ours.hints_listening().await;
    hinted(&mut hints).await;
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first.cast_signed())
        .fetch_one(theirs.pool())
        .await
        .expect("end the listener's session");
    assert!(ended);
    hinted(&mut hints).await;
    let again = ours.hints_listening().await;
    assert_ne!(again, first, "a new session listens");

    theirs.record(event(1), T0).await.expect("record theirs");
    hinted(&mut hints).await;
    assert_eq!(
        logs.said(&["lost the connection listening", &schema, "level=WARN"]),
        1,
        "the loss is warned of once: {:?}",
        logs.lines()
    );
}

/// Each stream starts from its own making: a hint given before it was made is not given again
/// to it; a second stream shares the listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_gives_the_hints_after_it_was_made() {
    let (ours, theirs, _elsewhere, _drop) = three_handles().await;
    let mut first = ours.commit_hints().expect("store-postgres pushes hints");
    let listening = ours.hints_listening().await;
    hinted(&mut first).await;
    theirs.record(event(1), T0).await.expect("record theirs");
    hinted(&mut first).await;

    let mut second = ours.commit_hints().expect("store-postgres pushes hints");
    assert_eq!(ours.hints_listening().await, listening, "one listener");
    let early = awareness_core::testkit::poll_once(std::pin::pin!(second.next())).await;
    assert!(!early, "the hint before it was made is not given to it");
    theirs.record(event(2), T0).await.expect("record theirs");
    hinted(&mut second).await;
    hinted(&mut first).await;
}

/// A listening connection the network drops without telling the client (the server ends its
/// session; the client's side stays open and silent) is taken for lost when the handle's proof
/// of life does not come back, and listened on again on a new connection, with a hint; later
/// commits are hinted as before. It used to wait on the silent connection for good, and no
/// hint ever came again (review, stop 55).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listening_connection_the_network_dropped_silently_is_listened_on_again() {
    listened_on_again_after_silence(false).await;
}

/// A try to listen again whose connection goes silent once made (its `LISTEN` never answered)
/// is given up within its bound and made again: hints come back. It used to wait on that
/// `LISTEN` for good, and no hint ever came again (stop 57).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_to_listen_on_a_silent_connection_is_given_up_and_made_again() {
    listened_on_again_after_silence(true).await;
}

/// A handle listening through a [`SilentProxy`] whose connections go silent (and, with
/// `mute_listen`, whose next `LISTEN` goes silent too): a new listening session comes within
/// the wait, with its hint, and another handle's commit is hinted after it.
async fn listened_on_again_after_silence(mute_listen: bool) {
    let proxy = SilentProxy::start();
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let (theirs, _) = server::fresh_store_in(&schema).await;
    let ours = proxy.store(&schema).await;
    let mut hints = ours.commit_hints().expect("store-postgres pushes hints");
    let first = ours.hints_listening().await;
    hinted(&mut hints).await;

    if mute_listen {
        proxy.mute_next_listen();
    }
    proxy.go_silent();
    let again = tokio::time::timeout(WAIT, async {
        loop {
            let pid = ours.hints_listening().await;
            if pid != first {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a new listening session within the wait");
    assert_ne!(again, first);
    assert!(
        !proxy.mute_listen.load(std::sync::atomic::Ordering::SeqCst),
        "a try to listen went silent, when asked to"
    );
    hinted(&mut hints).await;
    theirs.record(event(1), T0).await.expect("record theirs");
    hinted(&mut hints).await;
}

/// A store through a [`SilentProxy`] in a fresh schema (dropped with the guard), listening,
/// and its hint stream, whose first hint (the listener's start) is taken.
async fn listening_through_a_proxy() -> (
    SilentProxy,
    server::DropSchema,
    PgStore,
    Box<dyn CommitHints>,
) {
    let proxy = SilentProxy::start();
    let schema = server::fresh_schema();
    let drop = server::DropSchema(schema.clone());
    let ours = proxy.store(&schema).await;
    let mut hints = ours.commit_hints().expect("store-postgres pushes hints");
    ours.hints_listening().await;
    hinted(&mut hints).await;
    (proxy, drop, ours, hints)
}

/// A listening connection that fails (a message the client cannot read: a protocol error, not
/// a lost connection) is listened on again after a wait, not at once: a server or network that
/// fails every connection so gets a try a second, not a spin of them. (What the mutation did:
/// no wait after the error: the next try came within milliseconds of each failure; review of
/// stop 67, P502.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listening_connection_that_fails_is_listened_on_again_after_a_wait() {
    let logs = awareness_core::testkit::logs::Capture::warnings();
    // Its proofs of life are the notifications the proxy garbles.
    let (proxy, _drop, _ours, _hints) = listening_through_a_proxy().await;

    proxy.garble_listeners(true);
    until("three listening connections failed", || {
        proxy.seen.lock().unwrap().garbled.len() >= 3
    })
    .await;
    proxy.garble_listeners(false);
    let seen = std::mem::take(&mut *proxy.seen.lock().unwrap());
    // Not a measure of speed: the wait is the listener's own, and only the code that does not
    // wait can come sooner.
    for failed in &seen.garbled[..2] {
        let next = seen.listens.iter().find(|l| *l > failed);
        let after = next.map(|l| l.duration_since(*failed));
        assert!(
            after.is_some_and(|a| a >= Duration::from_secs(1)),
            "the next try to listen came {after:?} after a failure: {seen:?}"
        );
    }
    assert!(
        logs.said(&["listening for other handles' commits failed", "level=WARN"]) >= 1,
        "the failures were the listener's errors: {:?}",
        logs.lines()
    );
}

/// Tries to listen that keep failing come further and further apart (the wait doubles from a
/// second, up to 30 s): a server away for an hour is not asked a thousand times. (What the
/// mutation did: the wait stayed at a second, a try a second for the whole outage; review of
/// stop 69, P716.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tries_to_listen_that_keep_failing_come_further_apart() {
    let (proxy, _drop, _ours, _hints) = listening_through_a_proxy().await;

    // The listening connection fails at its next proof of life, and every try after it too.
    let before = proxy.seen.lock().unwrap().listens.len();
    proxy.cut_listens(true);
    proxy.garble_listeners(true);
    until("three tries to listen failed", || {
        proxy.seen.lock().unwrap().listens.len() >= before + 3
    })
    .await;
    proxy.cut_listens(false);
    proxy.garble_listeners(false);
    let seen = std::mem::take(&mut *proxy.seen.lock().unwrap());
    // Not a measure of speed: the waits are the listener's own (a second after the first
    // failed try, two after the second), and only code that waits less can come sooner.
    let tries = &seen.listens[before..];
    let apart = tries[2].duration_since(tries[1]);
    assert!(
        apart >= Duration::from_secs(2),
        "the third try came {apart:?} after the second: {seen:?}"
    );
}

/// A listener that cannot listen from its start tries again a second after its first try,
/// then two after that, and warns once for the outage, not at each try; once it listened again,
/// a new outage is warned of again. (What the mutations did: the first wait was 100 ms, so a
/// server away at the start was asked ten times as often, PH10; each failed try warned, PH11;
/// after the first outage, later ones were never warned of, PH12; review of stop 71.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_cannot_start_waits_a_second_and_warns_once_per_outage() {
    let logs = awareness_core::testkit::logs::Capture::warnings();
    let proxy = SilentProxy::start();
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let ours = proxy.store(&schema).await;
    proxy.cut_listens(true);
    let _hints = ours.commit_hints().expect("store-postgres pushes hints");
    until("three tries to listen failed", || {
        proxy.seen.lock().unwrap().listens.len() >= 3
    })
    .await;
    let tries = proxy.seen.lock().unwrap().listens.clone();
    // Not a measure of speed: the wait is the listener's own, and only code that waits less
    // can come sooner.
    let apart = tries[1].duration_since(tries[0]);
    assert!(
        apart >= Duration::from_secs(1),
        "the second try came {apart:?} after the first: {tries:?}"
    );
    let cannot = ["cannot listen for other handles' commits", schema.as_str()];
    assert_eq!(logs.said(&cannot), 1, "one warning: {:?}", logs.lines());

    proxy.cut_listens(false);
    ours.hints_listening().await;
    // The connection fails at its next proof of life, and every try after it too.
    proxy.cut_listens(true);
    proxy.garble_listeners(true);
    until("a warning for the second outage", || {
        logs.said(&cannot) >= 2
    })
    .await;
    proxy.cut_listens(false);
    proxy.garble_listeners(false);
}

/// A listening connection that answers is kept, however often its life is proven: no new
/// session, and no hint beyond the start's. Each proof has 200 ms to come back: at 10 ms, a
/// loaded machine (load average 6, reviewers building) answered one late and the test failed
/// (stop 58).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listening_connection_that_answers_is_kept() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let ours = PgStore::connect(
        server::server(),
        PgStoreOptions::new(schema.clone()).listener_keepalive(Duration::from_millis(200)),
    )
    .await
    .expect("connect");
    let mut hints = ours.commit_hints().expect("store-postgres pushes hints");
    let first = ours.hints_listening().await;
    hinted(&mut hints).await;
    // Ten proofs' worth.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ours.hints_listening().await, first, "the same session");
    assert_eq!(ours.hints_given(), 1, "the start's only");
}

/// A listening connection that answers is kept while the handle's pool is busy: with one
/// connection, taken by a write waiting for another gateway's lock, no proof of life can be
/// sent, and none is counted as asked. Proofs counted when they were asked, sent or not, took
/// the live connection for lost four times in two seconds, each time with a hint and a warning
/// (second reading, stop 56).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pool_does_not_make_a_live_listening_connection_look_lost() {
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let ours = std::sync::Arc::new(
        PgStore::connect(
            server::server(),
            PgStoreOptions::new(schema.clone())
                .max_connections(1)
                .listener_keepalive(Duration::from_millis(100)),
        )
        .await
        .expect("connect"),
    );
    let mut hints = ours.commit_hints().expect("store-postgres pushes hints");
    let first = ours.hints_listening().await;
    hinted(&mut hints).await;
    let held = store_postgres::testkit::StoreLock::take(&schema).await;
    let writer = std::sync::Arc::clone(&ours);
    let waiting = tokio::spawn(async move { writer.record(event(1), T0).await });
    // Twenty periods with the pool's only connection waiting on the lock.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ours.hints_listening().await, first, "the same session");
    assert_eq!(ours.hints_given(), 1, "the start's only");
    held.release().await;
    waiting
        .await
        .expect("join")
        .expect("the write, once the lock is free");
}

/// A listening connection that answers is kept while the handle's pool cannot send a proof of
/// life at all, each try failing at once (here the pool's session is ended and its role may no
/// longer log in, so that each new connection is refused; a server that takes no new
/// connections but keeps those it has does the same): no proof that failed is counted as
/// asked. Counted (a mutation every test passed: the busy pool's test above sees only proofs
/// that time out), the live connection was taken for lost a keepalive later, with a warning,
/// and dropped; the next could not be made (the role refused it too), and no hint came until
/// it could.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_fails_to_send_proofs_does_not_make_a_live_listening_connection_look_lost() {
    use sqlx::ConnectOptions as _;
    let logs = awareness_core::testkit::logs::Capture::warnings();
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let role = server::DropRole::create(format!("{schema}_gw"), "").await;
    // The store, made by the server's role; the handle's role may read and write its rows.
    server::fresh_store_in(&schema).await;
    role.may_use_rows_of(&schema).await;
    let mut admin = server::server().connect().await.expect("connect");
    let ours = PgStore::connect(
        server::as_role(&role.0),
        PgStoreOptions::new(schema.clone())
            .max_connections(1)
            .listener_keepalive(Duration::from_millis(100)),
    )
    .await
    .expect("connect as the role");
    let mut hints = ours.commit_hints().expect("store-postgres pushes hints");
    let first = ours.hints_listening().await;
    hinted(&mut hints).await;
    // The pool's session ends and no other can be made; the listener's goes on.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER ROLE \"{}\" NOLOGIN",
        role.0
    )))
    .execute(&mut admin)
    .await
    .expect("refuse the role's logins");
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE usename = $1 AND pid <> $2",
    )
    .bind(&role.0)
    .bind(first.cast_signed())
    .fetch_one(&mut admin)
    .await
    .expect("end the pool's session");
    // The pool's one session, unless a proof that timed out under load (its `timeout` of one
    // keepalive, 100 ms) already cost the pool its connection: either way, what the test needs
    // is that no session but the listener's is left, and none can be made.
    assert!(ended <= 1, "the pool's one session at most: {ended}");
    tokio::time::timeout(WAIT, async {
        loop {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND pid <> $2",
            )
            .bind(&role.0)
            .bind(first.cast_signed())
            .fetch_one(&mut admin)
            .await
            .expect("look");
            if left == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("no session of the role but the listener's");
    // Twenty periods whose proofs all fail.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        logs.said(&["stopped answering", &format!("schema={schema}")]),
        0,
        "the live connection is not taken for lost: {:?}",
        logs.lines()
    );
    let listening: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
        .bind(first.cast_signed())
        .fetch_one(&mut admin)
        .await
        .expect("look");
    assert_eq!(listening, 1, "the listener's session is kept");
    let now = tokio::time::timeout(WAIT, ours.hints_listening())
        .await
        .expect("listening");
    assert_eq!(now, first, "the same session");
    assert_eq!(ours.hints_given(), 1, "the start's only");
}

/// Proofs of life sent while no connection listened (here while a try to listen waits on a
/// silent connection, until its bound of 10 s) never come back: once a new connection listens,
/// only the proofs from then on count, and it is kept while none can be sent (the pool's one
/// connection taken by a write waiting for another gateway's lock). With the earlier proofs
/// left to count (a mutation every test passed: a proof sent within a keepalive of listening
/// again answered them all), the fresh connection was taken for lost a keepalive after it
/// listened, and so was each one after it, each time with a hint and a warning, for as long as
/// the pool stayed busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proofs_sent_while_nobody_listened_do_not_make_the_next_listening_connection_look_lost() {
    use sqlx::ConnectOptions as _;
    const KEEPALIVE: Duration = Duration::from_millis(300);
    let logs = awareness_core::testkit::logs::Capture::warnings();
    let proxy = SilentProxy::start();
    let schema = server::fresh_schema();
    let _drop = server::DropSchema(schema.clone());
    let ours = std::sync::Arc::new(
        PgStore::connect(
            proxy.server(),
            PgStoreOptions::new(schema.clone())
                .max_connections(1)
                .listener_keepalive(KEEPALIVE),
        )
        .await
        .expect("connect through the proxy"),
    );
    let mut hints = ours.commit_hints().expect("store-postgres pushes hints");
    let first = ours.hints_listening().await;
    hinted(&mut hints).await;
    let pool_pid = async || -> i32 {
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(ours.pool())
            .await
            .expect("the pool's one session")
    };
    let mut pool = pool_pid().await;
    let mut admin = server::server().connect().await.expect("connect");

    // The listener's session ends, and its next try to listen goes silent.
    proxy.mute_next_listen();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(first.cast_signed())
        .execute(&mut admin)
        .await
        .expect("end the listener's session");
    until("the next try to listen goes silent", || {
        !proxy.mute_listen.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    // Two proofs sent since, which nobody listens for: the server took their notifications
    // (the pool's session went idle after each).
    let mut since: String = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(&mut admin)
        .await
        .expect("the server's time");
    for _ in 0..2 {
        since = tokio::time::timeout(WAIT, async {
            loop {
                let sent: Option<String> = sqlx::query_scalar(
                    "SELECT state_change::text FROM pg_stat_activity WHERE pid = $1 \
                     AND state = 'idle' AND query = 'SELECT pg_notify($1, $2)' \
                     AND state_change > $2::timestamptz",
                )
                .bind(pool)
                .bind(&since)
                .fetch_optional(&mut admin)
                .await
                .expect("look");
                if let Some(sent) = sent {
                    return sent;
                }
                // A proof cut short by its timeout under load may have cost the pool its
                // session (sqlx closes a connection it cannot ping clean): look at the one the
                // pool has now.
                let alive: bool =
                    sqlx::query_scalar("SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1")
                        .bind(pool)
                        .fetch_one(&mut admin)
                        .await
                        .expect("look");
                if !alive {
                    pool = pool_pid().await;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("a proof sent within the wait");
    }
    // The pool's one connection then waits for another gateway's lock: no proof can be sent.
    pool = pool_pid().await;
    let held = store_postgres::testkit::StoreLock::take(&schema).await;
    let writer = std::sync::Arc::clone(&ours);
    let waiting = tokio::spawn(async move { writer.record(event(1), T0).await });
    tokio::time::timeout(WAIT, async {
        loop {
            let blocked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 \
                 AND wait_event = 'advisory'",
            )
            .bind(pool)
            .fetch_one(&mut admin)
            .await
            .expect("look");
            if blocked == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the write waits for the lock within the wait");
    assert_eq!(ours.hints_given(), 1, "nobody listens yet");

    // The try given up, the next listens; ten periods with no proof sent.
    let again = tokio::time::timeout(WAIT, ours.hints_listening())
        .await
        .expect("a new listening session within the wait");
    assert_ne!(again, first);
    hinted(&mut hints).await;
    tokio::time::sleep(KEEPALIVE * 10).await;
    assert_eq!(
        logs.said(&["stopped answering", &format!("schema={schema}")]),
        0,
        "the new connection is not taken for lost: {:?}",
        logs.lines()
    );
    let now = tokio::time::timeout(WAIT, ours.hints_listening())
        .await
        .expect("listening");
    assert_eq!(now, again, "the same session");
    assert_eq!(
        ours.hints_given(),
        2,
        "the start's and the new connection's"
    );
    held.release().await;
    waiting
        .await
        .expect("join")
        .expect("the write, once the lock is free");
}

/// A Unix-socket proxy to the test server that can go silent the way a dropped network flow
/// does (a NAT's idle timeout): the connections open when it is asked lose their server side
/// (so the server ends their sessions) while their client side stays open and says nothing.
/// Connections made later pass as before. It can also garble what listening connections are
/// sent ([`SilentProxy::garble_listeners`]).
struct SilentProxy {
    dir: std::path::PathBuf,
    silence: tokio::sync::watch::Sender<u64>,
    /// The next connection that sends a `LISTEN` goes silent as it sends it.
    mute_listen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// While set, each notification to a connection that listens is replaced by a message of
    /// no type the protocol has.
    garble: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// While set, a connection is closed as it sends a `LISTEN` (which is not sent on).
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// When each `LISTEN` (a try to listen) came, and when each notification was replaced.
    seen: std::sync::Arc<std::sync::Mutex<Seen>>,
}

/// What [`SilentProxy`] saw of the tries to listen.
#[derive(Debug, Default)]
struct Seen {
    listens: Vec<std::time::Instant>,
    garbled: Vec<std::time::Instant>,
}

impl SilentProxy {
    fn start() -> Self {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let target = server::server();
        let real = target
            .get_socket()
            .expect("the test server is reached by its socket")
            .join(format!(".s.PGSQL.{}", target.get_port()));
        let dir = std::env::temp_dir().join(store_postgres::testkit::fresh_name("silent"));
        std::fs::create_dir(&dir).expect("the proxy's directory");
        let accept =
            tokio::net::UnixListener::bind(dir.join(format!(".s.PGSQL.{}", target.get_port())))
                .expect("the proxy's socket");
        let silence = tokio::sync::watch::channel(0).0;
        let asked = silence.clone();
        let mute_listen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let muting = std::sync::Arc::clone(&mute_listen);
        let garble = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let garbling = std::sync::Arc::clone(&garble);
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cutting = std::sync::Arc::clone(&cut);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
        let seeing = std::sync::Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = accept.accept().await {
                let Ok(mut upstream) = tokio::net::UnixStream::connect(&real).await else {
                    continue;
                };
                let mut silenced = asked.subscribe();
                let born = *silenced.borrow_and_update();
                let muting = std::sync::Arc::clone(&muting);
                let garbling = std::sync::Arc::clone(&garbling);
                let cutting = std::sync::Arc::clone(&cutting);
                let seeing = std::sync::Arc::clone(&seeing);
                tokio::spawn(async move {
                    use std::sync::atomic::Ordering::SeqCst;
                    let (mut up, mut down) = (vec![0u8; 65536], vec![0u8; 65536]);
                    let mut listening = false;
                    loop {
                        tokio::select! {
                            _ = async { silenced.wait_for(|s| *s > born).await.map(drop) } => {
                                // The server's side ends; the client's is kept, silent, for
                                // as long as the test runs.
                                drop(upstream);
                                let _silent = client;
                                std::future::pending::<()>().await;
                                return;
                            }
                            n = client.read(&mut up) => match n {
                                Ok(0) | Err(_) => return,
                                Ok(n) => {
                                    let sent = &up[..n];
                                    // A try to listen (not the `UNLISTEN *` a dropped
                                    // listener sends on its connection before giving it back).
                                    let listen = |w: &[u8]| w.ends_with(b"LISTEN") && !w.starts_with(b"UN");
                                    if sent.windows(8).any(listen) {
                                        listening = true;
                                        seeing.lock().unwrap().listens.push(std::time::Instant::now());
                                        if cutting.load(SeqCst) {
                                            // Both sides closed.
                                            return;
                                        }
                                        if muting.swap(false, SeqCst) {
                                            // Swallowed, and silent from now on, as above.
                                            drop(upstream);
                                            let _silent = client;
                                            std::future::pending::<()>().await;
                                            return;
                                        }
                                    }
                                    if upstream.write_all(sent).await.is_err() { return }
                                }
                            },
                            n = upstream.read(&mut down) => match n {
                                Ok(0) | Err(_) => return,
                                // A notification (`A`): the connection listens by now.
                                // Once a connection: what comes after on it is not read.
                                Ok(_) if listening && down[0] == b'A' && garbling.load(SeqCst) => {
                                    listening = false;
                                    seeing.lock().unwrap().garbled.push(std::time::Instant::now());
                                    // Type 1, which no message has, with no content.
                                    if client.write_all(b"\x01\0\0\0\x04").await.is_err() { return }
                                }
                                Ok(n) => if client.write_all(&down[..n]).await.is_err() { return },
                            },
                        }
                    }
                });
            }
        });
        Self {
            dir,
            silence,
            mute_listen,
            garble,
            cut,
            seen,
        }
    }

    /// The server as the proxy serves it.
    fn server(&self) -> store_postgres::PgConnectOptions {
        server::server().socket(&self.dir)
    }

    /// A handle on `schema` through the proxy, which proves its listening connection alive
    /// every 200 ms (the proofs are notifications the listener must receive).
    async fn store(&self, schema: &str) -> PgStore {
        PgStore::connect(
            self.server(),
            PgStoreOptions::new(schema).listener_keepalive(Duration::from_millis(200)),
        )
        .await
        .expect("connect through the proxy")
    }

    /// Every connection open now goes silent.
    fn go_silent(&self) {
        self.silence.send_modify(|s| *s += 1);
    }

    /// The next connection that sends a `LISTEN` goes silent instead of sending it (the
    /// network dropped the flow once the connection was made).
    fn mute_next_listen(&self) {
        self.mute_listen
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on (`true`) or no longer, each notification to a listening connection is
    /// replaced by a message its client cannot read: its listener fails with a protocol error.
    fn garble_listeners(&self, on: bool) {
        self.garble.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on (`true`) or no longer, a connection is closed as it sends a `LISTEN`: every
    /// try to listen fails.
    fn cut_listens(&self, on: bool) {
        self.cut.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for SilentProxy {
    fn drop(&mut self) {
        drop(std::fs::remove_dir_all(&self.dir));
    }
}

/// A store whose schema's name begins with this store's (`<s>x` beside `<s>`) is another store: its
/// commits give no hint. A payload read by its prefix (`starts_with` instead of the schema before
/// the space) passed every other test: review of stop 62, P30.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_schema_name_extends_ours_is_another_store() {
    let one = server::fresh_schema();
    let longer = format!("{one}x");
    let _drop = [
        server::DropSchema(one.clone()),
        server::DropSchema(longer.clone()),
    ];
    let (ours, _) = server::fresh_store_in(&one).await;
    let (elsewhere, _) = server::fresh_store_in(&longer).await;
    let mut hints = ours.commit_hints().expect("store-postgres pushes hints");
    ours.hints_listening().await;
    hinted(&mut hints).await;
    elsewhere
        .record(event(0), T0)
        .await
        .expect("record elsewhere");
    ours.record(event(1), T0).await.expect("record ours");
    until("its own commit left out", || {
        ours.own_commits_left_out() == 1
    })
    .await;
    assert_eq!(
        ours.hints_given(),
        1,
        "the start's only: the store of schema {longer} is not {one}'s"
    );
}
