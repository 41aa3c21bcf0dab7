//! A `COMMIT` whose answer is lost: the connection to the server fails while a recording's
//! `COMMIT` is on its way or its answer is on the way back. The store asks the server whether
//! the transaction committed (on another connection), so that its caller is not left guessing
//! (and retrying an event that has no dedupe key, which would record it twice): committed, the
//! caller gets its event; rolled back, the store records it again, once, in the same turn;
//! the server out of reach, the caller gets an error saying the outcome is unknown, not
//! retryable (retried, an event without a dedupe key would be recorded twice). The other
//! writes (a watch, here) are asked about too: committed, a success; rolled back, a retryable
//! error; and in either case a session left idle in the transaction is ended.
//!
//! The faults are made by [`Proxy`], a stand-in for the server that the store connects to: it
//! passes every byte both ways and reads the store's messages, so that it can act on the
//! `COMMIT` (sqlx sends it as a simple query of that text).

mod server;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use awareness_core::testkit::group_commit::{T0, event};
use awareness_core::testkit::poll_once;
use awareness_core::{CursorStore as _, EventStore as _, Recorded, Sequence, StoreError};
use store_postgres::{PgConnectOptions, PgStore, PgStoreOptions};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// What [`Proxy`] does to the `COMMIT` it is armed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The `COMMIT` never reaches the server; both connections close (the server sees its
    /// client gone and rolls the transaction back).
    DropCommit,
    /// The `COMMIT` reaches the server, which commits; its answer never reaches the store,
    /// whose connection closes.
    LoseAnswer,
    /// The `COMMIT` never reaches the server, and the server's connection stays open, as a
    /// half-open TCP connection would: its session waits in its transaction, holding the
    /// store's lock, until something ends it.
    StallCommit,
    /// The statement that writes a recording's (or a batch's) events never reaches the server
    /// (its first `Parse` on the connection: armed before the connection's first recording),
    /// and the server's connection stays open: its session waits in the transaction, holding
    /// the store's lock.
    StallWrite,
    /// The `COMMIT` reaches the server; once the test calls [`Proxy::cut`] (the server busy
    /// with the `COMMIT` meanwhile, so that no answer comes to pass), the store's side of the
    /// connection closes and the server's stays open: the server goes on with the `COMMIT`,
    /// whose answer goes nowhere.
    CutAfterCommit,
    /// The `COMMIT` reaches the server, which commits; its answer is held until the test calls
    /// [`Proxy::release`], then passed on: the store gets it late (a slow network), and counts
    /// its commit then.
    HoldAnswer,
}

/// What the proxy's connections share.
#[derive(Default)]
struct State {
    /// The fault to make, and how many `COMMIT`s to let through first.
    armed: Mutex<Option<(Fault, usize)>>,
    /// `COMMIT`s a fault was made on.
    fired: AtomicUsize,
    /// Answers to a `COMMIT` that the store never got.
    swallowed: AtomicUsize,
    /// What becomes of the connections made after a fault was made.
    after_fault: Mutex<Later>,
    /// A statement run on the server (directly) once it has committed a `COMMIT` whose answer
    /// is swallowed, before the store's connection closes.
    after_commit: Mutex<Option<String>>,
    /// The server's side of the connections of [`Fault::StallCommit`] (and the others that
    /// hold it), and the connections [`Later::Hang`] holds, kept open.
    held: Mutex<Vec<Box<dyn Send>>>,
    /// Told by [`Proxy::cut`]: the cut of [`Fault::CutAfterCommit`] is made.
    cut: tokio::sync::Notify,
    /// Told by [`Proxy::release`]: the answer [`Fault::HoldAnswer`] holds is passed on.
    release: tokio::sync::Notify,
    /// Statements run through the proxy that end sessions (`pg_terminate_backend`).
    terminations: AtomicUsize,
}

/// What becomes of the connections made to the proxy after it made a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Later {
    /// Passed to the server.
    #[default]
    Pass,
    /// Closed at once (the server refuses).
    Close,
    /// Held open, never answered (the server out of reach).
    Hang,
}

impl State {
    /// The fault to make on this `COMMIT` (or, `write`, on this statement writing events), if
    /// any.
    fn fault_for(&self, write: bool) -> Option<Fault> {
        let mut armed = self.armed.lock().expect("armed");
        let (fault, skip) = armed.as_mut()?;
        if (*fault == Fault::StallWrite) != write {
            return None;
        }
        if *skip > 0 {
            *skip -= 1;
            return None;
        }
        let fault = *fault;
        *armed = None;
        self.fired.fetch_add(1, Ordering::SeqCst);
        Some(fault)
    }
}

/// A byte stream to or from the server.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A stand-in for the test server on a Unix socket of its own (in a scratch directory, as
/// PostgreSQL names its sockets), passing everything to the server until armed.
struct Proxy {
    dir: PathBuf,
    state: Arc<State>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts one on the caller's runtime.
    fn start() -> Self {
        let target = server::server();
        let dir = std::env::temp_dir().join(store_postgres::testkit::fresh_name("pgproxy"));
        std::fs::create_dir(&dir).expect("the proxy's directory");
        let listener =
            tokio::net::UnixListener::bind(dir.join(format!(".s.PGSQL.{}", target.get_port())))
                .expect("the proxy's socket");
        let state = Arc::new(State::default());
        let shared = Arc::clone(&state);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if shared.fired.load(Ordering::SeqCst) > 0 {
                    match *shared.after_fault.lock().expect("after_fault") {
                        Later::Pass => {}
                        Later::Close => continue,
                        Later::Hang => {
                            shared.held.lock().expect("held").push(Box::new(client));
                            continue;
                        }
                    }
                }
                let server = match connect(&target).await {
                    Ok(server) => server,
                    Err(e) => panic!("the proxy cannot reach the server: {e}"),
                };
                tokio::spawn(pass(client, server, Arc::clone(&shared)));
            }
        });
        Self { dir, state, accept }
    }

    /// The server, as the store sees it through the proxy.
    fn server(&self) -> PgConnectOptions {
        server::server().socket(&self.dir)
    }

    /// Makes `fault` on the `COMMIT` after the next `skip`.
    fn arm(&self, fault: Fault, skip: usize) {
        *self.state.armed.lock().expect("armed") = Some((fault, skip));
    }

    /// How many faults were made.
    fn fired(&self) -> usize {
        self.state.fired.load(Ordering::SeqCst)
    }

    /// How many answers to a `COMMIT` the store never got.
    fn swallowed(&self) -> usize {
        self.state.swallowed.load(Ordering::SeqCst)
    }

    /// Makes the cut of [`Fault::CutAfterCommit`] (now, or once its `COMMIT` has gone).
    fn cut(&self) {
        self.state.cut.notify_one();
    }

    /// Passes on the answer [`Fault::HoldAnswer`] holds (now, or once it comes).
    fn release(&self) {
        self.state.release.notify_one();
    }

    /// How many statements that end sessions (`pg_terminate_backend`) the store ran through
    /// the proxy.
    fn terminations(&self) -> usize {
        self.state.terminations.load(Ordering::SeqCst)
    }

    /// What becomes of the connections made after the fault.
    fn after_fault(&self, later: Later) {
        *self.state.after_fault.lock().expect("after_fault") = later;
    }

    /// Deletes the event `sequence` of the store in `schema` once the server has committed a
    /// `COMMIT` whose answer is swallowed: the log no longer holds that event as written.
    fn delete_after_commit(&self, schema: &str, sequence: u64) {
        *self.state.after_commit.lock().expect("after_commit") = Some(format!(
            "DELETE FROM \"{schema}\".session_state_events WHERE sequence = {sequence}"
        ));
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.state.held.lock().expect("held").clear();
        drop(std::fs::remove_dir_all(&self.dir));
    }
}

/// A connection to the test server, on its socket or over TCP, as its URL says.
async fn connect(target: &PgConnectOptions) -> std::io::Result<Box<dyn Io>> {
    Ok(match target.get_socket() {
        Some(dir) => Box::new(
            tokio::net::UnixStream::connect(dir.join(format!(".s.PGSQL.{}", target.get_port())))
                .await?,
        ),
        None => {
            Box::new(tokio::net::TcpStream::connect((target.get_host(), target.get_port())).await?)
        }
    })
}

/// How a connection through the proxy ended.
enum End {
    /// Close both sides.
    Close,
    /// Close the store's side only; keep the server's open ([`Fault::StallCommit`] and the
    /// others that hold it).
    HoldServer,
}

/// What becomes of the answer to a `COMMIT` of one connection that a fault was made on: set
/// once the `COMMIT` went to the server.
#[derive(Default)]
struct Answer {
    /// It must not reach the store ([`Fault::LoseAnswer`]).
    swallow: AtomicBool,
    /// It reaches the store once the test calls [`Proxy::release`] ([`Fault::HoldAnswer`]).
    hold: AtomicBool,
}

/// Passes one connection both ways until either side closes or a fault ends it.
async fn pass(client: tokio::net::UnixStream, server: Box<dyn Io>, state: Arc<State>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = tokio::io::split(server);
    let answer = Answer::default();
    let end = tokio::select! {
        end = upward(&mut from_client, &mut to_server, &state, &answer) => end,
        () = downward(&mut from_server, &mut to_client, &state, &answer) => End::Close,
    };
    if let End::HoldServer = end {
        state
            .held
            .lock()
            .expect("held")
            .push(Box::new((from_server, to_server)));
    }
}

/// The store's messages to the server: the untyped start-up ones (a TLS or GSS request, then
/// the start-up message), then typed ones, each passed whole unless it is the `COMMIT` a fault
/// is armed for. The statements run that end sessions are counted: a simple query that names
/// `pg_terminate_backend`, or the binding of a statement prepared with it (sqlx prepares a
/// statement once per connection, then only binds it).
async fn upward(
    from: &mut tokio::net::unix::OwnedReadHalf,
    to: &mut tokio::io::WriteHalf<Box<dyn Io>>,
    state: &State,
    answer: &Answer,
) -> End {
    const TLS_REQUEST: u32 = 80_877_103;
    const GSS_REQUEST: u32 = 80_877_104;
    /// What the statement that writes events starts its insert with.
    const WRITE: &[u8] = b"INSERT INTO session_state_events (";
    /// What a statement that ends sessions names.
    const TERMINATE: &[u8] = b"pg_terminate_backend";
    let names = |body: &[u8], text: &[u8]| body.windows(text.len()).any(|w| w == text);
    loop {
        let mut len = [0u8; 4];
        if from.read_exact(&mut len).await.is_err() {
            return End::Close;
        }
        let mut body = vec![0u8; (u32::from_be_bytes(len) as usize).saturating_sub(4)];
        if from.read_exact(&mut body).await.is_err()
            || to.write_all(&len).await.is_err()
            || to.write_all(&body).await.is_err()
        {
            return End::Close;
        }
        let code = body
            .get(..4)
            .map(|c| u32::from_be_bytes(c.try_into().expect("4 bytes")));
        if !matches!(code, Some(TLS_REQUEST | GSS_REQUEST)) {
            break;
        }
    }
    // The statements (by name) prepared on this connection that end sessions.
    let mut terminating = std::collections::HashSet::new();
    loop {
        let mut head = [0u8; 5];
        if from.read_exact(&mut head).await.is_err() {
            return End::Close;
        }
        let len = u32::from_be_bytes(head[1..].try_into().expect("4 bytes")) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        if from.read_exact(&mut body).await.is_err() {
            return End::Close;
        }
        // A `Parse` is the statement's name then its text; a `Bind`, the portal's name then
        // the statement's; each ends with a 0.
        let mut fields = body.split(|b| *b == 0);
        match head[0] {
            b'P' => {
                let name = fields.next().unwrap_or_default().to_vec();
                if names(&body, TERMINATE) {
                    terminating.insert(name);
                } else {
                    terminating.remove(&name);
                }
            }
            b'B' if fields.nth(1).is_some_and(|name| terminating.contains(name)) => {
                state.terminations.fetch_add(1, Ordering::SeqCst);
            }
            b'Q' if names(&body, TERMINATE) => {
                state.terminations.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        let fault = if head[0] == b'Q' && body == b"COMMIT\0" {
            state.fault_for(false)
        } else if head[0] == b'P' && names(&body, WRITE) {
            state.fault_for(true)
        } else {
            None
        };
        match fault {
            Some(Fault::DropCommit) => return End::Close,
            Some(Fault::StallCommit | Fault::StallWrite) => return End::HoldServer,
            Some(Fault::LoseAnswer) => answer.swallow.store(true, Ordering::SeqCst),
            Some(Fault::HoldAnswer) => answer.hold.store(true, Ordering::SeqCst),
            Some(Fault::CutAfterCommit) | None => {}
        }
        if to.write_all(&head).await.is_err() || to.write_all(&body).await.is_err() {
            return End::Close;
        }
        if fault == Some(Fault::CutAfterCommit) {
            state.cut.notified().await;
            return End::HoldServer;
        }
    }
}

/// The server's bytes to the store, until the answer to a swallowed `COMMIT` comes (the first
/// bytes after it went: the store sends it only once every earlier answer has come): the
/// server has committed, and the connection ends without it. The answer to a held `COMMIT`
/// (the same first bytes) waits for [`Proxy::release`], the bytes after it behind it.
async fn downward(
    from: &mut tokio::io::ReadHalf<Box<dyn Io>>,
    to: &mut tokio::net::unix::OwnedWriteHalf,
    state: &State,
    answer: &Answer,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if answer.swallow.load(Ordering::SeqCst) {
            state.swallowed.fetch_add(1, Ordering::SeqCst);
            let after = state.after_commit.lock().expect("after_commit").take();
            if let Some(sql) = after {
                use sqlx::{ConnectOptions as _, Connection as _};
                let mut conn = server::server().connect().await.expect("connect");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&mut conn)
                    .await
                    .expect("the statement after the commit");
                conn.close().await.expect("close");
            }
            return;
        }
        if answer.hold.swap(false, Ordering::SeqCst) {
            state.release.notified().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A store in a fresh schema reached through `proxy`, and a second handle on it that reaches
/// the server directly (to see what was committed).
async fn stores(
    proxy: &Proxy,
    options: impl Fn(PgStoreOptions) -> PgStoreOptions,
) -> (Arc<PgStore>, PgStore, server::DropSchema) {
    let schema = server::fresh_schema();
    let drop = server::DropSchema(schema.clone());
    let direct = PgStore::connect(server::server(), PgStoreOptions::new(schema.clone()))
        .await
        .expect("connect directly");
    let store = PgStore::connect(proxy.server(), options(PgStoreOptions::new(schema)))
        .await
        .expect("connect through the proxy");
    (Arc::new(store), direct, drop)
}

/// The events committed after `after`, as (sequence, summary).
async fn committed(direct: &PgStore, after: Sequence) -> Vec<(u64, String)> {
    direct
        .events_after(after, 1000)
        .await
        .expect("events")
        .iter()
        .map(|e| (e.sequence.get(), e.summary.clone()))
        .collect()
}

/// The answer to a recording's `COMMIT` is lost after the server committed it: the caller gets
/// its event (not an error it would retry), recorded once, in the one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_whose_commit_answer_was_lost_is_answered_as_committed() {
    let proxy = Proxy::start();
    let (store, direct, _drop) = stores(&proxy, |o| o).await;
    let before = store.record(event(100), T0).await.expect("record");
    let began = store.write_transactions();
    proxy.arm(Fault::LoseAnswer, 0);
    let rec = store
        .record(event(0), T0)
        .await
        .expect("the committed recording");
    assert_eq!(proxy.fired(), 1, "the answer was lost");
    let seq = before.event.sequence.get() + 1;
    assert_eq!((rec.event.sequence.get(), rec.deduplicated), (seq, false));
    assert_eq!(
        committed(&direct, before.event.sequence).await,
        vec![(seq, "message 0".to_owned())]
    );
    assert_eq!(store.write_transactions() - began, 1, "not recorded again");
    // The handle goes on: its next recording follows.
    let next = store.record(event(1), T0).await.expect("record");
    assert_eq!(next.event.sequence.get(), seq + 1);
}

/// A recording's `COMMIT` never reaches the server, which rolls it back: the store learns so
/// and records the event again, once, under the number the lost transaction did not keep.
/// Also when the server's side of the connection stays open (a half-open connection): its
/// session waits in the transaction, holding the store's lock, and the store ends it (found
/// by its process and the transaction it runs) without waiting for the server's
/// idle-transaction timeout (a minute: longer than the store asks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_whose_commit_never_arrived_is_recorded_again_once() {
    for fault in [Fault::DropCommit, Fault::StallCommit] {
        let proxy = Proxy::start();
        let (store, direct, _drop) = stores(&proxy, |o| o).await;
        let before = store.record(event(100), T0).await.expect("record");
        let began = store.write_transactions();
        proxy.arm(fault, 0);
        let rec = store
            .record(event(0), T0)
            .await
            .unwrap_or_else(|e| panic!("{fault:?}: {e}"));
        assert_eq!(proxy.fired(), 1, "{fault:?}");
        let seq = before.event.sequence.get() + 1;
        assert_eq!(rec.event.sequence.get(), seq, "{fault:?}");
        assert_eq!(
            committed(&direct, before.event.sequence).await,
            vec![(seq, "message 0".to_owned())],
            "{fault:?}"
        );
        assert_eq!(
            store.write_transactions() - began,
            2,
            "{fault:?}: the lost transaction, then the one that committed"
        );
    }
}

/// Starts `n` recordings (`event(0)`, ...) on `store` while another gateway holds its lock
/// (the first takes the handle's turn and waits for the lock; the others queue): released,
/// the first commits alone and the others in one batch.
async fn record_behind_the_lock(
    store: &Arc<PgStore>,
    schema: &str,
    n: usize,
) -> Vec<Result<Recorded, StoreError>> {
    record_these_behind_the_lock(store, schema, (0..n).map(event).collect()).await
}

/// [`record_behind_the_lock`] with `events`.
async fn record_these_behind_the_lock(
    store: &Arc<PgStore>,
    schema: &str,
    events: Vec<awareness_core::NewEvent>,
) -> Vec<Result<Recorded, StoreError>> {
    let lock = store_postgres::testkit::StoreLock::take(schema).await;
    let mut calls = Vec::new();
    for (i, e) in events.into_iter().enumerate() {
        let store = Arc::clone(store);
        let mut call = Box::pin(async move { store.record(e, T0).await });
        assert!(
            !poll_once(call.as_mut()).await,
            "recording {i} waits for the lock"
        );
        calls.push(tokio::spawn(call));
    }
    lock.release().await;
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.expect("join"));
    }
    answers
}

/// The batch of a group commit loses the answer to its `COMMIT`, or the `COMMIT` itself: each
/// caller gets its own event, every event committed once (the lost batch recorded again, as
/// one batch, when it did not commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_commit_was_lost_answers_every_caller_once_committed() {
    for (fault, transactions) in [(Fault::LoseAnswer, 2), (Fault::DropCommit, 3)] {
        let proxy = Proxy::start();
        let (store, direct, schema) = stores(&proxy, |o| o).await;
        let before = store.record(event(100), T0).await.expect("record");
        let began = store.write_transactions();
        // The first recording commits alone; the batch of the other seven loses its commit.
        proxy.arm(fault, 1);
        let answers = record_behind_the_lock(&store, &schema.0, 8).await;
        assert_eq!(proxy.fired(), 1, "{fault:?}");
        assert_eq!(
            proxy.swallowed(),
            usize::from(fault == Fault::LoseAnswer),
            "{fault:?}"
        );
        assert_eq!(store.largest_batch(), 7, "{fault:?}");
        let mut seqs = Vec::new();
        for (i, answer) in answers.into_iter().enumerate() {
            let rec = answer.unwrap_or_else(|e| panic!("{fault:?}: recording {i}: {e}"));
            assert_eq!(rec.event.summary, format!("message {i}"), "{fault:?}");
            seqs.push((rec.event.sequence.get(), rec.event.summary.clone()));
        }
        seqs.sort_unstable();
        let first = before.event.sequence.get() + 1;
        assert_eq!(
            seqs.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            (first..first + 8).collect::<Vec<_>>(),
            "{fault:?}"
        );
        assert_eq!(
            committed(&direct, before.event.sequence).await,
            seqs,
            "{fault:?}: every event once"
        );
        assert_eq!(
            store.write_transactions() - began,
            transactions,
            "{fault:?}: the first alone, the batch, and the batch again when it did not commit"
        );
    }
}

/// The answer to a recording's `COMMIT` is lost and the server cannot be reached again to ask
/// (it refuses connections, or never answers them): the caller gets an error that says the
/// outcome is unknown, not one that says the event was not recorded (it was), and not a
/// retryable one: retried, the event was recorded twice (review, stop 57).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_the_server_cannot_be_asked_about_is_an_unknown_outcome() {
    for later in [Later::Close, Later::Hang] {
        let proxy = Proxy::start();
        let (store, direct, _drop) = stores(&proxy, |o| o.max_connections(1)).await;
        let before = store.record(event(100), T0).await.expect("record");
        proxy.after_fault(later);
        proxy.arm(Fault::LoseAnswer, 0);
        let e = store
            .record(event(0), T0)
            .await
            .expect_err("the outcome cannot be known");
        assert_eq!(proxy.swallowed(), 1, "{later:?}");
        let why = match later {
            Later::Hang => "could not be asked whether it committed within 5s",
            _ => "could not be asked whether it committed (",
        };
        assert_unknown_outcome(&e, &[why, "read it back"]);
        assert_eq!(
            committed(&direct, before.event.sequence).await,
            vec![(before.event.sequence.get() + 1, "message 0".to_owned())],
            "{later:?}: the server had committed it"
        );
    }
}

/// Whether `store` holds `watcher`'s cursor on the session of `event(0)`: what a watch whose
/// commit lost its answer left.
async fn watched(store: &PgStore, watcher: &awareness_core::WatcherKey) -> bool {
    store
        .cursor(watcher, &event(0).session.session_key)
        .await
        .expect("cursor")
        .is_some()
}

/// Asserts that `e` says a write's outcome is unknown after its `COMMIT` lost its answer: a
/// [`StoreError::Backend`], not retryable (a retry may do the write twice), whose text says so
/// and holds each of `also`.
fn assert_unknown_outcome(e: &StoreError, also: &[&str]) {
    let text = awareness_core::error::ErrorChain(e).to_string();
    assert!(
        matches!(e, StoreError::Backend { .. }) && !e.is_retryable(),
        "{e:?}"
    );
    assert!(
        text.contains("the connection was lost during COMMIT")
            && text.contains("the outcome is unknown")
            && also.iter().all(|a| text.contains(a)),
        "{text} should say {also:?}"
    );
}

/// A watch whose `COMMIT` lost its answer, the server then out of reach: the outcome is unknown
/// and said so, not retryable (`Busy` says nothing was written; a write other than a
/// recording, done again, may do more than once: the second reading of stop 57).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_lost_commit_cannot_be_asked_about_is_an_unknown_outcome() {
    let proxy = Proxy::start();
    let (store, direct, _drop) = stores(&proxy, |o| o.max_connections(1)).await;
    store.record(event(0), T0).await.expect("record");
    let watcher = awareness_core::WatcherKey::parse("agent:main:main").expect("watcher");
    proxy.after_fault(Later::Close);
    proxy.arm(Fault::LoseAnswer, 0);
    let e = store
        .watch(&watcher, &event(0).session, T0)
        .await
        .expect_err("the outcome cannot be known");
    assert_eq!(proxy.swallowed(), 1);
    assert_unknown_outcome(&e, &["read back"]);
    assert!(
        watched(&direct, &watcher).await,
        "the server had committed it"
    );
}

/// The same for a batch of a group commit (on by default): every caller in it gets the
/// unknown outcome, not retryable. Only single recordings were checked, and a batch that went
/// back to `Busy` passed every test (the second reading of stop 57).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_lost_commit_cannot_be_asked_about_is_an_unknown_outcome_for_each_caller() {
    let proxy = Proxy::start();
    let (store, _direct, schema) = stores(&proxy, |o| o.max_connections(1)).await;
    store.record(event(100), T0).await.expect("record");
    proxy.after_fault(Later::Close);
    // The first recording commits alone; the batch of the other three loses its answer.
    proxy.arm(Fault::LoseAnswer, 1);
    let answers = record_behind_the_lock(&store, &schema.0, 4).await;
    assert_eq!(store.largest_batch(), 3);
    assert_eq!(proxy.swallowed(), 1);
    assert!(answers[0].is_ok(), "{:?}", answers[0]);
    for answer in answers.iter().skip(1) {
        let e = answer.as_ref().expect_err("the outcome cannot be known");
        assert_unknown_outcome(e, &[]);
    }
}

/// A batch of dedupe hits alone loses the answer to its `COMMIT` (which would only have moved
/// the counter), and the server cannot be asked again: each caller gets the stored event, as a
/// dedupe hit recorded alone does. (Asking the server about the stored events, as if the batch
/// had written them, made each an unknown outcome, and every test passed: review of stop 60.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_dedupe_hits_whose_commit_was_lost_is_answered_with_the_stored_events() {
    let proxy = Proxy::start();
    let (store, _direct, schema) = stores(&proxy, |o| o.max_connections(1)).await;
    let keyed = |i: usize| event(i).with_dedupe_key(format!("once {i}"));
    let mut stored = Vec::new();
    for i in 0..4 {
        stored.push(store.record(keyed(i), T0).await.expect("record").event);
    }
    proxy.after_fault(Later::Close);
    // The first hit commits alone; the batch of the other three loses its answer.
    proxy.arm(Fault::LoseAnswer, 1);
    let answers =
        record_these_behind_the_lock(&store, &schema.0, (0..4).map(keyed).collect()).await;
    assert_eq!(store.largest_batch(), 3);
    assert_eq!(proxy.swallowed(), 1);
    for (i, answer) in answers.into_iter().enumerate() {
        let hit = answer.unwrap_or_else(|e| panic!("hit {i}: {e}"));
        assert!(hit.deduplicated, "hit {i}");
        assert_eq!(hit.event, stored[i], "hit {i}");
    }
}

/// The server says the transaction whose `COMMIT` lost its answer committed, but the log does
/// not hold its event as written (here deleted right after the commit; after a server restart,
/// the transaction's id may have gone to another transaction, which took the same number):
/// the caller is not told its event was recorded; the outcome is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_whose_events_are_not_in_the_log_as_written_is_an_unknown_outcome() {
    let proxy = Proxy::start();
    let (store, _direct, schema) = stores(&proxy, |o| o).await;
    let before = store.record(event(100), T0).await.expect("record");
    proxy.delete_after_commit(&schema.0, before.event.sequence.get() + 1);
    proxy.arm(Fault::LoseAnswer, 0);
    let e = store
        .record(event(0), T0)
        .await
        .expect_err("the event is not in the log");
    assert_eq!(proxy.swallowed(), 1);
    assert_unknown_outcome(&e, &["does not hold its events as written"]);
}

/// The same for a batch whose log holds only some of its events as written (here the second
/// of two deleted right after the commit): every caller's outcome is unknown, the first's
/// too. (Taking any of them found for all of them passed every test: review of stop 60.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_of_a_batch_whose_log_holds_part_of_it_is_an_unknown_outcome() {
    let proxy = Proxy::start();
    let (store, _direct, schema) = stores(&proxy, |o| o).await;
    let before = store.record(event(100), T0).await.expect("record");
    // The first recording commits alone (before + 1); the batch of the other two (before + 2
    // and + 3) loses its answer, and the second of them is gone.
    proxy.delete_after_commit(&schema.0, before.event.sequence.get() + 3);
    proxy.arm(Fault::LoseAnswer, 1);
    let answers = record_behind_the_lock(&store, &schema.0, 3).await;
    assert_eq!(store.largest_batch(), 2);
    assert_eq!(proxy.swallowed(), 1);
    assert!(answers[0].is_ok(), "{:?}", answers[0]);
    for answer in answers.iter().skip(1) {
        let e = answer
            .as_ref()
            .expect_err("the batch is not in the log as written");
        assert_unknown_outcome(e, &["does not hold its events as written"]);
    }
}

/// A recording that is a dedupe hit loses its `COMMIT` (which would only have moved the
/// counter): its caller gets the stored event, as it would have either way, in one
/// transaction, even when the server cannot be asked (here it refuses the store's later
/// connections). When the `COMMIT` stalled on a half-open connection, the session left in the
/// transaction (holding the store's lock) is ended all the same: the next recording gets the
/// lock at once (within the server's `lock_timeout` of 5 s, where the session would have held
/// it for the idle-transaction timeout of a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedupe_hit_whose_commit_was_lost_is_answered_with_the_stored_event() {
    for fault in [Fault::LoseAnswer, Fault::DropCommit, Fault::StallCommit] {
        let proxy = Proxy::start();
        let schema = server::DropSchema(server::fresh_schema());
        let store = PgStore::connect(
            proxy.server().options([("lock_timeout", "5s")]),
            PgStoreOptions::new(schema.0.clone()).max_connections(1),
        )
        .await
        .expect("connect through the proxy");
        let first = store
            .record(event(0).with_dedupe_key("once"), T0)
            .await
            .expect("record");
        let began = store.write_transactions();
        if fault == Fault::LoseAnswer {
            proxy.after_fault(Later::Close);
        }
        proxy.arm(fault, 0);
        let hit = store
            .record(event(1).with_dedupe_key("once"), T0)
            .await
            .unwrap_or_else(|e| panic!("{fault:?}: {e}"));
        assert_eq!(proxy.fired(), 1, "{fault:?}");
        assert!(hit.deduplicated, "{fault:?}");
        assert_eq!(hit.event, first.event, "{fault:?}");
        assert_eq!(store.write_transactions() - began, 1, "{fault:?}");
        if fault != Fault::LoseAnswer {
            let next = store
                .record(event(2), T0)
                .await
                .unwrap_or_else(|e| panic!("{fault:?}: the next recording: {e}"));
            assert!(!next.deduplicated, "{fault:?}");
        }
    }
}

/// A dedupe hit loses the answer to its `COMMIT`, which the server committed (it moved the
/// counter): asked, the server says so, and the commit is counted as the handle's own, as a
/// watch's is (below), so that `foreign_commits` does not show it as another gateway's. (Left
/// uncounted, as it was under mutation with every test passing, the handle's next question
/// sent it looking for another gateway's notices: review of stop 60.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedupe_hit_whose_lost_commit_committed_is_no_foreign_commit() {
    let proxy = Proxy::start();
    let (store, _direct, _drop) = stores(&proxy, |o| o).await;
    let first = store
        .record(event(0).with_dedupe_key("once"), T0)
        .await
        .expect("record");
    let before = store.foreign_commits().await.expect("ask");
    proxy.arm(Fault::LoseAnswer, 0);
    let hit = store
        .record(event(1).with_dedupe_key("once"), T0)
        .await
        .expect("the stored event");
    assert_eq!(proxy.fired(), 1, "the answer was lost");
    assert!(hit.deduplicated);
    assert_eq!(hit.event, first.event);
    assert_eq!(
        store.foreign_commits().await.expect("ask"),
        before,
        "only this handle wrote"
    );
}

/// A write other than a recording (here a watch) loses the answer to its `COMMIT`, which the
/// server committed: the store asks the server, as for a recording, and answers a success; the
/// commit is counted as the handle's own, so that `foreign_commits` does not show it as
/// another gateway's. (It answered `Busy`, and the handle's next question took its own watch
/// for another writer's commit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_commit_answer_was_lost_is_answered_as_committed() {
    let proxy = Proxy::start();
    let (store, direct, _drop) = stores(&proxy, |o| o).await;
    store.record(event(0), T0).await.expect("record");
    let before = store.foreign_commits().await.expect("ask");
    let watcher = awareness_core::WatcherKey::parse("agent:main:main").expect("watcher");
    proxy.arm(Fault::LoseAnswer, 0);
    store
        .watch(&watcher, &event(0).session, T0)
        .await
        .expect("the committed watch");
    assert_eq!(proxy.fired(), 1, "the answer was lost");
    assert!(watched(&direct, &watcher).await, "committed");
    assert_eq!(
        store.foreign_commits().await.expect("ask"),
        before,
        "only this handle wrote"
    );
}

/// A `foreign_commits` asked while one of the handle's commits is made on the server but its
/// answer is still on the way (here held at the proxy, [`Fault::HoldAnswer`]; a slow network
/// holds one the same way) answers after the handle has counted that commit as its own, in
/// the handle's turn, as the docs promise: what it answered before (only this handle wrote);
/// and another gateway's commit after it is seen as a change. Read outside the turn (the
/// mutation `run_write` to `run` in `PgStore::foreign_commits`, which every test passed), it
/// read the count with the commit in it but not yet counted as the handle's own, and showed
/// it as another gateway's: the gateway read its watchers' cursors for nothing, then took the
/// next answer, once another gateway had committed, for no change, leaving the notices that
/// gateway handed out to the pick-up's recovery interval. The question is given two seconds
/// to answer before the
/// answer is released: read outside the turn, it answers in milliseconds; in the turn, it
/// cannot answer before the release, so the test's outcome on the real code does not depend
/// on the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_asked_while_a_commit_awaits_its_answer_takes_it_for_the_handle_s_own() {
    let proxy = Proxy::start();
    let (store, direct, _drop) = stores(&proxy, |o| o).await;
    let before = store.foreign_commits().await.expect("ask");
    proxy.arm(Fault::HoldAnswer, 0);
    let recording = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.record(event(0), T0).await }
    });
    // The server has committed once the direct handle sees the event (a hang guard, never a
    // timing assertion: it comes in milliseconds).
    let since = std::time::Instant::now();
    while committed(&direct, Sequence(0)).await.is_empty() {
        assert!(
            since.elapsed() < std::time::Duration::from_mins(1),
            "the server never committed the recording"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(proxy.fired(), 1);
    assert!(!recording.is_finished(), "the answer is held");
    let mut asking = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.foreign_commits().await }
    });
    let early = tokio::time::timeout(std::time::Duration::from_secs(2), &mut asking).await;
    proxy.release();
    let meanwhile = match early {
        Ok(answer) => answer,
        Err(_) => asking.await,
    }
    .expect("the question's task")
    .expect("ask");
    answered_and_recorded_once(recording, &direct).await;
    assert_eq!(
        meanwhile, before,
        "asked while its commit awaited its answer: only this handle wrote"
    );
    direct
        .record(event(1), T0)
        .await
        .expect("another gateway records");
    assert_ne!(
        store.foreign_commits().await.expect("ask"),
        meanwhile,
        "another gateway's commit is a change"
    );
}

/// A watch's `COMMIT` never reaches the server, whose side of the connection stays open: its
/// session waits in the transaction holding the store's lock, and the store ends it as it does
/// a recording's, so that another gateway's recording goes on at once instead of after the
/// server's idle-transaction timeout (a minute, longer than the wait below). The watch answers
/// a retryable error: nothing was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_commit_never_arrived_lets_go_of_the_lock() {
    let proxy = Proxy::start();
    let (store, direct, _drop) = stores(&proxy, |o| o).await;
    store.record(event(0), T0).await.expect("record");
    let watcher = awareness_core::WatcherKey::parse("agent:main:main").expect("watcher");
    proxy.arm(Fault::StallCommit, 0);
    let answer = store.watch(&watcher, &event(0).session, T0).await;
    assert_eq!(proxy.fired(), 1);
    assert!(matches!(answer, Err(StoreError::Busy { .. })), "{answer:?}");
    let other = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        direct.record(event(1), T0),
    )
    .await
    .expect("another gateway records without waiting for the idle timeout");
    other.expect("record");
    assert!(!watched(&direct, &watcher).await, "rolled back");
}

/// The statement that writes a recording's events (alone, then a batch's) never reaches the
/// server, whose side of the connection stays open: the caller gets a retryable error and
/// nothing is written, and the session left idle in the transaction is ended at once, so that
/// another gateway's recording does not wait for the server's idle-transaction timeout (a
/// minute) on the store's lock, as it did (review, stop 55). Also with a pool of one
/// connection, which the lost transaction held: it is given up before the server is asked,
/// else the question waited for it (five seconds) and gave up, leaving the session to the
/// timeout (second reading, stop 56).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_whose_write_never_arrived_lets_go_of_the_lock() {
    for (batch, pool) in [(false, 4), (true, 4), (false, 1), (true, 1)] {
        let proxy = Proxy::start();
        let (store, direct, schema) = stores(&proxy, |o| {
            let o = o.max_connections(pool);
            if batch { o } else { o.group_commit(1) }
        })
        .await;
        let before = direct.record(event(100), T0).await.expect("record");
        let failed: Vec<StoreError> = if batch {
            // The first recording (alone) writes; the batch of the other three stalls.
            proxy.arm(Fault::StallWrite, 1);
            let answers = record_behind_the_lock(&store, &schema.0, 4).await;
            assert_eq!(store.largest_batch(), 3);
            answers
                .into_iter()
                .skip(1)
                .map(|a| a.expect_err("the stalled batch"))
                .collect()
        } else {
            proxy.arm(Fault::StallWrite, 0);
            vec![
                store
                    .record(event(0), T0)
                    .await
                    .expect_err("the stalled recording"),
            ]
        };
        assert_eq!(proxy.fired(), 1, "batch {batch}, pool {pool}");
        for e in &failed {
            assert!(e.is_retryable(), "batch {batch}, pool {pool}: {e:?}");
        }
        let other = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            direct.record(event(101), T0),
        )
        .await
        .expect("another gateway records without waiting for the idle timeout")
        .expect("record");
        let kept: Vec<String> = committed(&direct, before.event.sequence)
            .await
            .into_iter()
            .map(|(_, summary)| summary)
            .collect();
        let mut want = if batch {
            vec!["message 0".to_owned()]
        } else {
            Vec::new()
        };
        want.push(other.event.summary.clone());
        assert_eq!(
            kept, want,
            "batch {batch}, pool {pool}: the stalled write left nothing"
        );
    }
}

/// A recording's `COMMIT` that the server ends with an administrator's error (`57P01`: its
/// session terminated while the `COMMIT` ran; `pg_ctl stop -m fast` sends the same) may have
/// committed or not, as a lost connection may: the store asks the server, learns here that
/// nothing committed, and records the event again, once. Taken for a refusal (nothing written,
/// `Busy`, as it was with `57P` left out of the lost answers and every test passing: review of
/// stop 60), the caller got an error, and a retry of a `COMMIT` that had in fact committed
/// recorded the event twice. The `COMMIT` is held at the server ([`hold_the_first_commit`]),
/// so that the session is terminated at its `COMMIT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_an_administrator_ends_is_asked_about_and_recorded_once() {
    use sqlx::ConnectOptions as _;
    let (store, schema) = server::fresh_store().await;
    let store = Arc::new(store);
    let mut admin = server::server().connect().await.expect("connect");
    hold_the_first_commit(&mut admin, schema.name()).await;
    let recording = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.record(event(0), T0).await }
    });
    let pid = waiting_at_commit(&mut admin).await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&mut admin)
        .await
        .expect("terminate");
    let_commits_go(&mut admin, schema.name()).await;
    answered_and_recorded_once(recording, &store).await;
}

/// A recording's `COMMIT` reaches the server, which is still busy with it (here held at a
/// trigger, [`hold_the_first_commit`]; a synchronous standby slow to confirm holds one the
/// same way) when the store's connection fails: asked, the server says the transaction is in
/// progress, and the store leaves the busy session to finish its `COMMIT` (it ends only a
/// session idle in the transaction, as `END_LOST_COMMIT` says), asking again until it has; the
/// caller gets its event, committed by that first transaction. With the state left out of
/// `END_LOST_COMMIT` (a mutation every test passed), the store terminated
/// the session in the middle of its `COMMIT`: the transaction was rolled back and the event
/// recorded again in a second one (the trigger ran twice), where the docs promise that a busy
/// `COMMIT` is left to finish (one waiting for a synchronous standby, ended, leaves its
/// transaction committed on the primary only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_still_running_when_its_answer_was_lost_is_left_to_finish() {
    use sqlx::ConnectOptions as _;
    let proxy = Proxy::start();
    let (store, direct, schema) = stores(&proxy, |o| o).await;
    let mut admin = server::server().connect().await.expect("connect");
    hold_the_first_commit(&mut admin, &schema.0).await;
    proxy.arm(Fault::CutAfterCommit, 0);
    let recording = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.record(event(0), T0).await }
    });
    let pid = waiting_at_commit(&mut admin).await;
    proxy.cut();
    // The store asks whether the transaction committed, finds it in progress, and asks again
    // every 10 ms, each time with `END_LOST_COMMIT` (a hang guard, never a timing assertion).
    let since = std::time::Instant::now();
    while proxy.terminations() < 2 && !recording.is_finished() {
        assert!(
            since.elapsed() < std::time::Duration::from_mins(1),
            "the store neither asked twice nor answered"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(proxy.fired(), 1);
    assert!(
        !recording.is_finished(),
        "the recording is answered only once its first COMMIT is done"
    );
    let running: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query = 'COMMIT' \
         AND state = 'active'",
    )
    .bind(pid)
    .fetch_one(&mut admin)
    .await
    .expect("look");
    assert_eq!(running, 1, "the session busy with the COMMIT is left to it");
    let_commits_go(&mut admin, &schema.0).await;
    answered_and_recorded_once(recording, &direct).await;
    assert_eq!(
        trigger_runs(&mut admin, &schema.0).await,
        1,
        "recorded by the first transaction, whose COMMIT was left to finish"
    );
}

/// Asserts that `recording` (of `event(0)`, the first of its store) answers its caller with
/// its event, which `store` holds once.
async fn answered_and_recorded_once(
    recording: tokio::task::JoinHandle<Result<Recorded, StoreError>>,
    store: &PgStore,
) {
    let recorded = recording
        .await
        .expect("the recording's task")
        .expect("the caller gets its event");
    assert_eq!(
        committed(store, Sequence(0)).await,
        vec![(recorded.event.sequence.get(), "message 0".to_owned())],
        "recorded once"
    );
}

/// Holds at the server the `COMMIT` of the first event the store in schema `s` records from
/// now on, until [`let_commits_go`]: a deferred constraint trigger on the events, run at the
/// `COMMIT`, waits for a two-key advisory lock (apart from the store's own, of one 64-bit key)
/// that `admin` takes here. It waits on its first run only: a sequence's `nextval`, which no
/// rollback undoes, tells the runs apart ([`trigger_runs`]).
async fn hold_the_first_commit(admin: &mut sqlx::PgConnection, s: &str) {
    for sql in [
        format!("CREATE SEQUENCE \"{s}\".trigger_runs"),
        format!(
            "CREATE FUNCTION \"{s}\".wait_at_commit() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF nextval('\"{s}\".trigger_runs') = 1 THEN \
             PERFORM pg_advisory_xact_lock_shared(hashtext(TG_TABLE_SCHEMA), 57); END IF; \
             RETURN NULL; END $$"
        ),
        format!(
            "CREATE CONSTRAINT TRIGGER wait_at_commit AFTER INSERT ON \
             \"{s}\".session_state_events DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
             EXECUTE FUNCTION \"{s}\".wait_at_commit()"
        ),
        format!("SELECT pg_advisory_lock(hashtext('{s}'), 57)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *admin)
            .await
            .expect("set up");
    }
}

/// The process id of the session whose `COMMIT` waits at the trigger of
/// [`hold_the_first_commit`] (the lock `admin` holds), once it does (a hang guard, never a
/// timing assertion: it comes there in milliseconds).
async fn waiting_at_commit(admin: &mut sqlx::PgConnection) -> i32 {
    let since = std::time::Instant::now();
    loop {
        assert!(
            since.elapsed() < std::time::Duration::from_mins(1),
            "the recording's COMMIT never waited at the trigger"
        );
        let waiting: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE wait_event = 'advisory' \
             AND query = 'COMMIT' AND pg_backend_pid() = ANY(pg_blocking_pids(pid))",
        )
        .fetch_optional(&mut *admin)
        .await
        .expect("look");
        if let Some(pid) = waiting {
            return pid;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Lets go of the lock of [`hold_the_first_commit`]: the `COMMIT` held goes on.
async fn let_commits_go(admin: &mut sqlx::PgConnection, s: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT pg_advisory_unlock(hashtext('{s}'), 57)"
    )))
    .execute(admin)
    .await
    .expect("unlock");
}

/// How many times the trigger of [`hold_the_first_commit`] ran (committed or not).
async fn trigger_runs(admin: &mut sqlx::PgConnection, s: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM \"{s}\".trigger_runs"
    )))
    .fetch_one(admin)
    .await
    .expect("the trigger's runs")
}

/// The log holds an event of the lost transaction's number, ref and time but with another summary
/// (as when, after a restart, the transaction's id went to another transaction that recorded on the
/// same session in the same millisecond): not the caller's event, so the outcome is unknown.
/// Comparing without the summary passed every other test: review of stop 62, P01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_whose_event_has_another_summary_in_the_log_is_an_unknown_outcome() {
    let proxy = Proxy::start();
    let (store, _direct, schema) = stores(&proxy, |o| o).await;
    let before = store.record(event(100), T0).await.expect("record");
    *proxy.state.after_commit.lock().expect("after_commit") = Some(format!(
        "UPDATE \"{}\".session_state_events SET summary = 'another' WHERE sequence = {}",
        schema.0,
        before.event.sequence.get() + 1
    ));
    proxy.arm(Fault::LoseAnswer, 0);
    let e = store
        .record(event(0), T0)
        .await
        .expect_err("the log does not hold the event as written");
    assert_eq!(proxy.swallowed(), 1);
    assert_unknown_outcome(&e, &["does not hold its events as written"]);
}

/// A `COMMIT` the server refuses (here a deferred constraint trigger that raises `23514` as the
/// transaction commits) is the server's answer, not a lost one: the caller gets that error, not
/// retryable, and the recording is tried once. (What the mutation did: the server asked about every
/// failed `COMMIT`, and the refusal came back as "lost during COMMIT ... did not commit",
/// retryable, after the recording was tried a second time; review of stop 64, PG07.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_the_server_refuses_is_its_error_and_not_a_lost_answer() {
    use sqlx::ConnectOptions as _;
    let (store, schema) = server::fresh_store().await;
    let s = schema.name();
    let mut admin = server::server().connect().await.expect("connect");
    for sql in [
        format!("CREATE SEQUENCE \"{s}\".trigger_runs"),
        format!(
            "CREATE FUNCTION \"{s}\".refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM nextval('\"{s}\".trigger_runs'); \
             RAISE EXCEPTION 'refused at commit' USING ERRCODE = '23514'; END $$"
        ),
        format!(
            "CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON \
             \"{s}\".session_state_events DEFERRABLE INITIALLY DEFERRED FOR EACH ROW \
             EXECUTE FUNCTION \"{s}\".refuse_at_commit()"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .expect("set up");
    }
    let e = store
        .record(event(0), T0)
        .await
        .expect_err("the server refuses the commit");
    assert!(!e.is_retryable(), "a refused commit is not retryable: {e}");
    assert!(
        !e.to_string().contains("lost during COMMIT"),
        "a refused commit is no lost answer: {e}"
    );
    assert_eq!(
        trigger_runs(&mut admin, s).await,
        1,
        "the recording was tried once"
    );
}
