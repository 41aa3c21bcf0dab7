//! Commit hints by polling `PRAGMA data_version` ([`awareness_core::EventStore::commit_hints`]),
//! the shape DESIGN.md section 9.1 gives SQLite: "noticed through `PRAGMA data_version`
//! polling".
//!
//! A handle asked for hints starts one poller: a thread of its own with a small runtime and a
//! read connection of its own, which reads `PRAGMA data_version` every
//! [`crate::SqliteOptions::commit_hint_interval`]. SQLite changes that number for every commit
//! another connection made, this handle's write connection included, so a change alone does
//! not say whose commit it was. The write connection's own number does: its own commits never
//! move it ([`crate::SqliteStore::foreign_commits`] answers with it). So at a change the poller
//! asks the write connection for its number, and hints when that moved since it last asked (or
//! when the question failed, or a write of the handle kept the connection past a quarter of a
//! second, as one waiting for another process's lock does: a hint may be one too many, never
//! one too few, and not one held up behind that lock). A read-only handle has no commits of its
//! own: every change is hinted.
//!
//! The write connection is asked before the number it is compared with is read: first at the
//! start (its answer, then the poller's own first number), then at every change, after the
//! poll. A commit by another writer made after the poller's first number therefore changes the
//! poller's number at a later poll, and is in the write connection's answer at that poll, which
//! the last answer before it did not hold: it is hinted at that poll. Commits made before the
//! poller read its first numbers (it starts in the background, at the first `commit_hints`)
//! are in no comparison: the poller gives one hint once it has them, which the streams made
//! before it take (a stream made after it has nothing to catch up on).
//!
//! (A first version asked the write connection only when one of this handle's write
//! operations overlapped the poll, and hinted other changes at once. A review found it dropped
//! a commit made while the poller started, and hinted the handle's own commit made after a
//! hinted one: the answer it compared with was older than the hint. At most one question a
//! poll, while the file changes, is not worth that.)

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use awareness_core::hints::{Hinted, Hinter};
use awareness_core::{CommitHints, StoreError};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _, SqliteConnection};
use tokio::sync::{MutexGuard, mpsc, oneshot};
use tracing::{debug, info, warn};

use crate::conn::{WriteSlot, Writer, batch_one, get};
use crate::sql;

/// What a handle's poller has done, for tests ([`crate::SqliteStore::commit_polls`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitPolls {
    /// Polls that read the number.
    pub polls: u64,
    /// Polls whose number had changed.
    pub changes: u64,
    /// Changes for which the write connection was asked (every change, on a handle that
    /// writes).
    pub writer_asked: u64,
    /// Hints given.
    pub hints: u64,
}

#[derive(Debug, Default)]
struct Counts {
    polls: AtomicU64,
    changes: AtomicU64,
    writer_asked: AtomicU64,
}

/// What a poller needs from its handle.
pub(crate) struct Setup {
    pub(crate) options: SqliteConnectOptions,
    pub(crate) writer: Option<Weak<WriteSlot>>,
    pub(crate) interval: Duration,
    pub(crate) path: Arc<Path>,
    /// The file the handle opened ([`OpenedFile::at`] at open), which the poller checks the
    /// path still names.
    pub(crate) file: Option<OpenedFile>,
}

/// The file a handle opened: its path made absolute as SQLite makes it at open (a process that
/// changes its working directory later does not change the file), and its device and inode.
#[derive(Debug, Clone)]
pub(crate) struct OpenedFile {
    path: Arc<Path>,
    id: (u64, u64),
}

impl OpenedFile {
    /// The file `path` names now (through symbolic links, as SQLite opens it), if it can be
    /// told.
    pub(crate) fn at(path: &Path) -> Option<Self> {
        let path = std::path::absolute(path).ok()?;
        let id = identity(&path).ok()??;
        Some(Self {
            path: path.into(),
            id,
        })
    }

    /// Whether its path still names it: `None` when that cannot be told (the file's
    /// directory cannot be searched, say), which is not taken for a file gone.
    fn still_named(&self) -> Option<bool> {
        match identity(&self.path) {
            Ok(now) => now.map(|now| now == self.id),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(false),
            Err(_) => None,
        }
    }
}

/// The device and inode of the file `path` names (`None` where the platform does not tell).
#[cfg(unix)]
fn identity(path: &Path) -> std::io::Result<Option<(u64, u64)>> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map(|m| Some((m.dev(), m.ino())))
}

/// Not told on this platform: nothing is checked.
#[cfg(not(unix))]
fn identity(_path: &Path) -> std::io::Result<Option<(u64, u64)>> {
    Ok(None)
}

/// A handle's poller, started by the first [`Poller::subscribe`].
#[derive(Debug, Default)]
pub(crate) struct Poller {
    running: Mutex<Option<Running>>,
    counts: Arc<Counts>,
}

#[derive(Debug)]
struct Running {
    hints: Hinted,
    /// Asks for a poll now; dropped (with the handle, or by [`Poller::stop`]), it ends the
    /// poller.
    now: Option<mpsc::UnboundedSender<oneshot::Sender<()>>>,
    /// Answers (the sender dropped) once the poller's thread has closed its connection.
    done: Option<oneshot::Receiver<()>>,
}

/// Longest wait between two attempts to open the poller's connection.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How long a poll that saw a change waits for the write connection (which a write of this
/// handle may have) to ask it whose commit that was, before it hints without knowing.
const WRITER_PATIENCE: Duration = Duration::from_millis(250);

impl Poller {
    /// A stream of hints, the poller started if it is not running yet (`setup` is called then).
    pub(crate) fn subscribe(&self, setup: impl FnOnce() -> Setup) -> Box<dyn CommitHints> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let mut first = None;
        let running = running.get_or_insert_with(|| {
            let setup = setup();
            let (tx, hints) = awareness_core::hints::channel();
            // The first caller's stream is taken before the poller starts: the hint it gives
            // once it began (for the commits made before) reaches that stream however soon it
            // comes. Taken after, it would be counted as seen already.
            first = Some(hints.stream());
            let (now, asked) = mpsc::unbounded_channel();
            let (finished, done) = oneshot::channel();
            let counts = Arc::clone(&self.counts);
            let path = Arc::clone(&setup.path);
            let started = std::thread::Builder::new()
                .name("store-sqlite-commit-poll".into())
                .spawn(move || {
                    let finished = finished;
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .build()
                    {
                        Ok(rt) => rt.block_on(poll(setup, asked, tx, &counts)),
                        Err(e) => {
                            warn!(path = %setup.path.display(), error = %awareness_core::error::ErrorChain(&e), "cannot poll for other writers' commits; the pick-up's questions still find them");
                        }
                    }
                    drop(finished);
                });
            if let Err(e) = started {
                // The hints' sender went with the closure: the streams end at once, and the
                // caller's questions are what find other writers' commits.
                warn!(path = %path.display(), error = %awareness_core::error::ErrorChain(&e), "cannot start polling for other writers' commits; the pick-up's questions still find them");
            }
            Running {
                hints,
                now: Some(now),
                done: Some(done),
            }
        });
        // Hints from now on; the streams end once the poller is gone (its handle was dropped
        // or closed).
        first.unwrap_or_else(|| running.hints.stream())
    }

    /// Asks the running poller for a poll now; answers once it is done, or `None` when no
    /// poller runs.
    pub(crate) fn poll_now(&self) -> Option<oneshot::Receiver<()>> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let running = running.as_ref()?;
        let (tx, rx) = oneshot::channel();
        running.now.as_ref()?.send(tx).ok()?;
        Some(rx)
    }

    /// What the poller has done.
    pub(crate) fn counts(&self) -> CommitPolls {
        let hints = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, |r| r.hints.given());
        CommitPolls {
            polls: self.counts.polls.load(Ordering::SeqCst),
            changes: self.counts.changes.load(Ordering::SeqCst),
            writer_asked: self.counts.writer_asked.load(Ordering::SeqCst),
            hints,
        }
    }

    /// Ends the poller, if one runs, and waits until its connection is closed.
    pub(crate) async fn stop(&self) {
        let done = {
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            running.as_mut().and_then(|r| {
                // Closing the channel ends the poller at its next wait.
                r.now = None;
                r.done.take()
            })
        };
        if let Some(done) = done {
            drop(done.await);
        }
    }
}

/// `PRAGMA data_version` of the write connection in `slot`, which this handle's own commits
/// never change ([`crate::SqliteStore::foreign_commits`]). Waits for the connection while a
/// write of this handle has it.
pub(crate) async fn writer_data_version(slot: &WriteSlot) -> Result<u64, StoreError> {
    version_of(slot.lock().await).await
}

/// [`writer_data_version`] of the write connection `slot` holds.
async fn version_of(mut slot: MutexGuard<'_, Option<Writer>>) -> Result<u64, StoreError> {
    const WHAT: &str = "read the data version";
    let Some(w) = slot.as_mut() else {
        return Err(StoreError::backend(WHAT, "the store is closed"));
    };
    if w.open_tx {
        // What an interrupted write left open goes first, as before any write.
        w.rollback().await;
    }
    data_version(&mut w.conn).await
}

/// `PRAGMA data_version` of `conn`.
pub(crate) async fn data_version(conn: &mut SqliteConnection) -> Result<u64, StoreError> {
    const WHAT: &str = "read the data version";
    let row = batch_one(conn, sqlx::query(sql::DATA_VERSION), WHAT).await?;
    Ok(get::<i64>(&row, 0, WHAT)?.cast_unsigned())
}

/// Waits `interval` or for a request of a poll now: `None` once the handle let go of the
/// poller, `Some(None)` at the end of the interval, `Some(Some(ack))` at a request.
async fn wait(
    asked: &mut mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    interval: Duration,
) -> Option<Option<oneshot::Sender<()>>> {
    match tokio::time::timeout(interval, asked.recv()).await {
        Ok(Some(ack)) => Some(Some(ack)),
        Ok(None) => None,
        Err(_) => Some(None),
    }
}

/// The poller's loop: opens its connection, then polls until the handle lets go of it.
async fn poll(
    setup: Setup,
    mut asked: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    hints: Hinter,
    counts: &Counts,
) {
    let hint = || hints.hint();
    let path = setup.path.display();
    let writer = setup.writer.as_ref();
    // The write connection's number as last asked (`None`: not known, which any answer then
    // differs from), asked before the poller's own number it goes with. A connection a write of
    // this handle keeps past WRITER_PATIENCE is not waited for (the write may be waiting for
    // another process's lock, for up to `busy_timeout`, and the change may be a commit that
    // process made just before): not known, so hinted.
    let ask_writer = async |counts: &Counts| {
        let slot = writer.and_then(Weak::upgrade)?;
        counts.writer_asked.fetch_add(1, Ordering::SeqCst);
        let Ok(held) = tokio::time::timeout(WRITER_PATIENCE, slot.lock()).await else {
            debug!(path = %path, "the write connection is in use past the poller's patience: the change is hinted");
            return Some(Err(StoreError::backend(
                "read the data version",
                format!("the write connection stayed in use for {WRITER_PATIENCE:?}"),
            )));
        };
        Some(version_of(held).await)
    };
    let mut backoff = setup
        .interval
        .clamp(Duration::from_millis(100), MAX_BACKOFF);
    let mut failed = false;
    let (mut conn, mut writer_last, mut last) = loop {
        let opened = async {
            let mut conn = setup
                .options
                .connect()
                .await
                .map_err(|e| StoreError::backend("open a connection to poll for commits", e))?;
            let writer_last = ask_writer(counts).await.and_then(Result::ok);
            match data_version(&mut conn).await {
                Ok(v) => Ok((conn, writer_last, v)),
                Err(e) => {
                    drop(conn.close().await);
                    Err(e)
                }
            }
        }
        .await;
        match opened {
            Ok(opened) => break opened,
            Err(e) => {
                if failed {
                    debug!(path = %path, error = %awareness_core::error::ErrorChain(&e), "still cannot poll for other writers' commits");
                } else {
                    failed = true;
                    warn!(path = %path, error = %awareness_core::error::ErrorChain(&e), "cannot poll for other writers' commits; the pick-up's questions still find them, and polling is tried again");
                }
                match wait(&mut asked, backoff).await {
                    None => return,
                    Some(ack) => drop(ack),
                }
                backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
            }
        }
    };
    if failed {
        info!(path = %path, "polling for other writers' commits");
    }
    // Commits made before the first numbers (while the poller started, or while it could not
    // open its connection) are in no comparison to come: one hint for all of them, which the
    // streams made before it take, and those made after it do not.
    hint();
    let mut failing = false;
    // Whether the path was last seen to name a file other than the handle's.
    let mut replaced = false;
    while let Some(ack) = wait(&mut asked, setup.interval).await {
        // A file deleted or replaced (a backup moved over it) while the handle has it open
        // stays the handle's: every read and write of the handle goes on in it, where nothing
        // that opens the path (another gateway, the CLI, this gateway started again) sees them,
        // and no other writer's commit reaches it. SQLite does not tell; the poller does, once.
        if let Some(now) = setup.file.as_ref().and_then(OpenedFile::still_named) {
            if !now && !replaced {
                warn!(path = %path, "the store's file was deleted or replaced while this handle has it open: the handle reads and writes the file it opened, which nothing opening the path reaches any more (what it records is lost to every other process, and to this one once it closes); close the store and open the path again");
            } else if now && replaced {
                info!(path = %path, "the path names the store's file again");
            }
            replaced = !now;
        }
        // A test's pause point, inside a poll (compiled in tests only; a helper of the test
        // `close_waits_for_a_poll_under_way`, review of stop 67).
        #[cfg(test)]
        crate::tests::IN_A_POLL.at(&setup.path).await;
        match data_version(&mut conn).await {
            Ok(v) => {
                counts.polls.fetch_add(1, Ordering::SeqCst);
                if failing {
                    failing = false;
                    info!(path = %path, "polling for other writers' commits again");
                }
                if v != last {
                    last = v;
                    counts.changes.fetch_add(1, Ordering::SeqCst);
                    let another = match ask_writer(counts).await {
                        Some(Ok(w)) => writer_last.replace(w) != Some(w),
                        // Not known: told, as a hint may be one too many; the next answer is
                        // then told too.
                        Some(Err(_)) => {
                            writer_last = None;
                            true
                        }
                        // A read-only handle: every commit is another writer's. (Or the
                        // handle is going, and nobody is left to tell.)
                        None => setup.writer.is_none(),
                    };
                    if another {
                        hint();
                    }
                }
            }
            Err(e) => {
                // The last number read stays the one to compare with: the connection's number
                // only ever moves on, so nothing is missed once it answers again.
                if failing {
                    debug!(path = %path, error = %awareness_core::error::ErrorChain(&e), "polling for other writers' commits failed again");
                } else {
                    failing = true;
                    warn!(path = %path, error = %awareness_core::error::ErrorChain(&e), "polling for other writers' commits failed; trying again at the next poll");
                }
            }
        }
        if let Some(ack) = ack {
            let _answered = ack.send(());
        }
    }
    if let Err(e) = conn.close().await {
        debug!(path = %path, error = %awareness_core::error::ErrorChain(&e), "closing the connection that polled for commits");
    }
}
