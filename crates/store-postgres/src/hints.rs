//! Commit hints through `LISTEN`/`NOTIFY` ([`awareness_core::EventStore::commit_hints`]).
//!
//! Every write transaction that moves the store's commit count notifies [`rows::CHANNEL`] with
//! the store's schema and the handle's id as payload ([`rows::COUNT_COMMIT`] and the
//! recording statements); the server delivers it once the transaction commits. A handle asked
//! for hints starts one listener (a connection of its own, outside the store's pool, on the
//! store's runtime) that counts the notifications of its store's schema sent by other handles:
//! not its own (its id), not other schemas' stores'. Each time the listener begins to listen
//! it counts a hint: the first time for the commits made since the caller asked for hints,
//! after a lost connection for those sent meanwhile (lost). A connection the network dropped
//! without telling the client would wait for ever: every
//! [`crate::PgStoreOptions::listener_keepalive`] the handle notifies itself on a channel of its
//! own, and a notification not received by the next one takes the connection for lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use awareness_core::CommitHints;
use awareness_core::hints::{Hinted, Hinter};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::rows;

/// The session setting every session of a handle carries its id in (a placeholder setting,
/// which PostgreSQL takes for any name with a dot), read by the `notify!` of `rows`.
pub(crate) const HANDLE_SETTING: &str = "session_awareness.handle";

/// A new handle's id: 64 random bits (std's hasher keys are random per process), in hex, so
/// that no two handles, of one process or of several hosts, are likely to share one.
pub(crate) fn handle_id() -> String {
    use std::hash::BuildHasher as _;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let id = std::collections::hash_map::RandomState::new().hash_one((
        n,
        std::process::id(),
        std::time::SystemTime::now(),
    ));
    format!("{id:016x}")
}

/// A handle's listener, started by the first [`Listener::subscribe`].
#[derive(Debug)]
pub(crate) struct Listener {
    hints: Mutex<Option<Hinted>>,
    /// Notifications of its handle's own commits the listener left out.
    pub(crate) own_left_out: Arc<AtomicU64>,
    /// The backend process id of the listener's session while it listens.
    pub(crate) session: Arc<watch::Sender<Option<u32>>>,
    /// How often the listening connection is proven alive
    /// ([`crate::PgStoreOptions::listener_keepalive`]).
    keepalive: Duration,
}

impl Listener {
    /// A listener, not started, that proves its connection alive every `keepalive`.
    pub(crate) fn new(keepalive: Duration) -> Self {
        Self {
            hints: Mutex::default(),
            own_left_out: Arc::default(),
            session: Arc::new(watch::channel(None).0),
            keepalive,
        }
    }

    /// The hints the listener has given (0 before it starts).
    pub(crate) fn given(&self) -> u64 {
        self.hints
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, Hinted::given)
    }

    /// A stream of hints, the listener started on `runtime` if it is not running yet.
    pub(crate) fn subscribe(
        &self,
        runtime: &tokio::runtime::Handle,
        pool: &PgPool,
        schema: &str,
        own: &str,
    ) -> Box<dyn CommitHints> {
        let mut hints = self.hints.lock().unwrap_or_else(PoisonError::into_inner);
        let mut first = None;
        let hinted = hints.get_or_insert_with(|| {
            let (tx, rx) = awareness_core::hints::channel();
            // The first caller's stream is taken before the listener starts: the hint it gives
            // once it listens (for the commits made before) reaches that stream however soon
            // it comes, the runtime's other threads running the task at once. Taken after, it
            // would be counted as seen already.
            first = Some(rx.stream());
            let proofs = Proofs::new(own);
            if self.keepalive != Duration::MAX {
                runtime.spawn(prove(pool.clone(), Arc::clone(&proofs), self.keepalive));
            }
            runtime.spawn(listen(
                (*pool.connect_options()).clone(),
                format!("{schema} {own}"),
                schema.to_owned(),
                tx,
                Arc::clone(&self.own_left_out),
                Arc::clone(&self.session),
                (proofs, self.keepalive),
            ));
            rx
        });
        // Hints from now on; the streams end once the listener's task is gone (the store's
        // runtime shut down with it).
        first.unwrap_or_else(|| hinted.stream())
    }
}

/// Longest time a try to listen takes (the connection, its `LISTEN` and the question of its
/// session's id) before it is given up and tried again.
const LISTEN_START: Duration = Duration::from_secs(10);

/// Longest wait between two attempts to listen again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The wait before the next attempt to listen, after one that waited `backoff` failed: twice
/// as long, at most [`MAX_BACKOFF`] (hints come back within that of the server's return, however
/// long it was away).
fn next_backoff(backoff: Duration) -> Duration {
    (backoff * 2).min(MAX_BACKOFF)
}

/// The proofs that the listening connection is alive: notifications the handle sends itself on
/// a channel of its own (`session_awareness_alive_<id>`, payload the proof's number) through
/// its pool, which the listener must receive.
#[derive(Debug)]
struct Proofs {
    channel: String,
    /// The number of the last proof sent: the server took its notification (a proof that
    /// could not be sent, its pool busy or out of reach, is asked of no one).
    asked: watch::Sender<u64>,
    /// The number of the last proof the listener received.
    received: AtomicU64,
}

impl Proofs {
    fn new(own: &str) -> Arc<Self> {
        Arc::new(Self {
            channel: format!("session_awareness_alive_{own}"),
            asked: watch::channel(0).0,
            received: AtomicU64::new(0),
        })
    }

    /// Ends when a proof asked for has not been received `wait` after it was asked (or after
    /// this was called, whichever is later; a notification received meanwhile starts the wait
    /// again, which the listener's `select!` does by calling this anew). Never ends while every
    /// proof asked for was received.
    async fn unanswered(&self, wait: Duration) {
        let mut asked = self.asked.subscribe();
        loop {
            let last = *asked.borrow_and_update();
            if last > self.received.load(Ordering::SeqCst) {
                tokio::time::sleep(wait).await;
                if self.received.load(Ordering::SeqCst) < last {
                    return;
                }
            } else if asked.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Sends a proof every `every`, for as long as the store's runtime runs: notifies the
/// handle's own channel through the store's pool, and counts the proof as asked once the
/// server has taken the notification, which it then delivers to every session listening on
/// that channel. A proof that cannot be sent within `every` (the pool's connections all busy,
/// a write waiting on another gateway's lock; the server out of reach) is not counted: a slow
/// pool must not make a live listening connection look lost.
async fn prove(pool: PgPool, proofs: Arc<Proofs>, every: Duration) {
    let mut number = 0;
    loop {
        tokio::time::sleep(every).await;
        number += 1;
        let sent = tokio::time::timeout(
            every,
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(&proofs.channel)
                .bind(number.to_string())
                .execute(&pool),
        )
        .await;
        match sent {
            Ok(Ok(_)) => {
                proofs
                    .asked
                    .send_modify(|asked| *asked = (*asked).max(number));
            }
            Ok(Err(e)) => {
                debug!(error = %e, "could not send the listening connection its proof of life");
            }
            Err(_) => {
                debug!("could not send the listening connection its proof of life in time");
            }
        }
    }
}

/// The listener's task: listens on a connection of its own to `server` and counts in `hints`
/// each notification of `schema` but the handle's own (whose payload is `own`), and each time
/// it begins to listen (the first time, and again after losing its connection, or taking it
/// for lost when a proof of `proofs` did not come back within `keepalive`); ends with the
/// store's runtime.
async fn listen(
    server: PgConnectOptions,
    own: String,
    schema: String,
    hints: Hinter,
    own_left_out: Arc<AtomicU64>,
    session: Arc<watch::Sender<Option<u32>>>,
    (proofs, keepalive): (Arc<Proofs>, Duration),
) {
    let hint = || hints.hint();
    let mut backoff = Duration::from_secs(1);
    let mut failing = false;
    loop {
        // A connection of its own, outside the store's pool (the listener holds it while it
        // waits, which would take one of the pool's from the store's writes and reads), in a
        // pool of its own made for each try: a listener dropped on a connection that stopped
        // answering leaves its connection to a task that unlistens on it before giving it
        // back, which then waits on it for as long as the network keeps it.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(LISTEN_START)
            .connect_lazy_with(server.clone());
        // Within a bound of its own: a network that drops the flow silently after the
        // connection is made would leave `LISTEN` waiting for ever, and hints would stop for
        // good.
        let started = tokio::time::timeout(LISTEN_START, async {
            let mut listener = PgListener::connect_with(&pool).await?;
            // A lost connection ends `try_recv` at once, and is listened to again here.
            listener.eager_reconnect(false);
            listener
                .listen_all([rows::CHANNEL, proofs.channel.as_str()])
                .await?;
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut listener)
                .await?;
            Ok::<_, sqlx::Error>((listener, pid))
        })
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the connection did not begin listening within {LISTEN_START:?}"),
            )))
        });
        let (mut listener, pid) = match started {
            Ok(started) => started,
            Err(e) => {
                if failing {
                    debug!(schema = %schema, error = %e, "still cannot listen for other handles' commits");
                } else {
                    failing = true;
                    warn!(schema = %schema, error = %e, "cannot listen for other handles' commits; the pick-up's questions still find them, and listening is tried again");
                }
                tokio::time::sleep(backoff).await;
                backoff = next_backoff(backoff);
                continue;
            }
        };
        if failing {
            info!(schema = %schema, "listening for other handles' commits again");
        }
        failing = false;
        backoff = Duration::from_secs(1);
        // The proofs asked for before it listened cannot come: only those from now on count.
        proofs
            .received
            .fetch_max(*proofs.asked.borrow(), Ordering::SeqCst);
        // Commits made while nobody listened were not told: one hint for all of them. The
        // first time too: a commit made after the caller asked for hints and before the
        // listener listened (the caller's own question, made then, may have come before it).
        // Given before the session is published, so that once `hints_listening` answers, the
        // hint is there for every stream made before.
        hint();
        session.send_replace(Some(pid.cast_unsigned()));
        loop {
            // A proof not received in time: the connection is taken for lost, and dropped
            // with the wait on it (the connection is not used again, so what that wait had
            // read of a message does not matter).
            let received = tokio::select! {
                received = listener.try_recv() => received,
                () = proofs.unanswered(keepalive) => {
                    session.send_replace(None);
                    warn!(schema = %schema, "the connection listening for other handles' commits stopped answering; listening again on a new one");
                    break;
                }
            };
            match received {
                Ok(Some(n)) if n.channel() == proofs.channel => {
                    if let Ok(number) = n.payload().parse::<u64>() {
                        proofs.received.fetch_max(number, Ordering::SeqCst);
                    }
                }
                Ok(Some(n)) => {
                    let payload = n.payload();
                    if payload == own {
                        own_left_out.fetch_add(1, Ordering::Relaxed);
                    } else if payload.split_once(' ').is_some_and(|(of, _)| of == schema) {
                        hint();
                    }
                    // Otherwise another store's.
                }
                // The connection was lost (what was sent meanwhile is lost), or failed: listened
                // to again from the top, which counts a hint.
                // Warned of, as a connection that stops answering is: each loss costs a hint
                // (a pick-up reading the cursors), and a connection the server or the network
                // keeps ending is otherwise seen nowhere.
                Ok(None) => {
                    session.send_replace(None);
                    warn!(schema = %schema, "lost the connection listening for other handles' commits; listening again on a new one");
                    break;
                }
                Err(e) => {
                    session.send_replace(None);
                    warn!(schema = %schema, error = %e, "listening for other handles' commits failed; listening again on a new one");
                    // Not at once: an error that comes back at every try would spin.
                    tokio::time::sleep(backoff).await;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The waits between attempts to listen double from a second up to 30 s and stay there: a
    /// server away for an hour is listened to again within 30 s of its return. (Uncapped, as
    /// it was under mutation with every test passing, the wait after an hour away was about
    /// as long again: review of stop 60.)
    #[test]
    fn the_wait_between_attempts_to_listen_doubles_up_to_30_seconds() {
        let waits: Vec<u64> =
            std::iter::successors(Some(Duration::from_secs(1)), |b| Some(next_backoff(*b)))
                .take(12)
                .map(|b| b.as_secs())
                .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30, 30, 30, 30, 30]);
    }
}
