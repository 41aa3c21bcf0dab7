//! A point inside a store's own operation where that store's unit tests hold it, to make
//! something happen at that exact moment (a cursor touched between a pruning round's choice
//! and its write).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

/// An operation calls [`Pause::at`] with its store's file; a test that [`Pause::arm`]ed the
/// pause for that file is told the operation got there, and the operation waits until the test
/// lets it go on. Operations on other files (the other tests of the crate, running at the same
/// time) pass through.
#[derive(Debug, Default)]
pub struct Pause(Mutex<Option<Armed>>);

#[derive(Debug)]
struct Armed {
    path: PathBuf,
    reached: Arc<Notify>,
    go: Arc<Notify>,
}

impl Pause {
    /// A pause armed for no file.
    pub const fn new() -> Self {
        Self(Mutex::new(None))
    }

    fn armed(&self) -> MutexGuard<'_, Option<Armed>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds the operation on `path` when the pause is armed for it.
    pub async fn at(&self, path: &Path) {
        let held = self
            .armed()
            .as_ref()
            .filter(|a| a.path == path)
            .map(|a| (Arc::clone(&a.reached), Arc::clone(&a.go)));
        if let Some((reached, go)) = held {
            reached.notify_one();
            go.notified().await;
        }
    }

    /// Arms the pause for `path`: answers what is notified when an operation gets there, and
    /// what lets it go on ([`Notify::notify_one`]).
    pub fn arm(&self, path: &Path) -> (Arc<Notify>, Arc<Notify>) {
        let (reached, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        *self.armed() = Some(Armed {
            path: path.to_owned(),
            reached: Arc::clone(&reached),
            go: Arc::clone(&go),
        });
        (reached, go)
    }

    /// Lets every later operation pass through.
    pub fn disarm(&self) {
        *self.armed() = None;
    }
}

/// The check of a store that chooses idle cursors outside the write that deletes them, with
/// `pause` held between the two for `path` (its file): a cursor touched between an idle-cursor
/// round's choice and its write is no longer idle and stays; the other one chosen goes; and the
/// chunk goes on by what the round chose, not by what its write deleted, so the idle cursor
/// past the round's bound goes in the same chunk. (What the mutation did: store-sqlite counting
/// what the write deleted ended the chunk at the touched cursor, the last idle one left for the
/// next pass; review of stop 63, Q02.)
pub async fn a_cursor_touched_after_the_idle_choice_is_not_pruned(
    store: Arc<dyn crate::AwarenessStore>,
    pause: &Pause,
    path: &Path,
) {
    use crate::{PruneStep, SessionRef, Timestamp, WatcherKey};
    const T0: Timestamp = Timestamp(1_800_000_000_000);
    let w = WatcherKey::parse("agent:main:main").expect("watcher");
    let r = |key| SessionRef::parse(key, "main").expect("ref");
    let (touched, idle, past) = (
        r("agent:main:subagent:a"),
        r("agent:main:subagent:b"),
        r("agent:main:subagent:c"),
    );
    for target in [&touched, &idle, &past] {
        store.watch(&w, target, T0).await.expect("watch");
    }
    let (chosen, go) = pause.arm(path);
    let later = T0.plus_ms(2 * Timestamp::DAY_MS);
    let pruning = tokio::spawn({
        let store = Arc::clone(&store);
        async move {
            let step = PruneStep::Cursors {
                cutoff: T0.plus_ms(1),
            };
            // A round of two: the first chooses the touched and the idle cursor.
            store.prune_chunk(&step, 2, later).await
        }
    });
    chosen.notified().await;
    // Watching again a cursor idle for a day refreshes it.
    store.watch(&w, &touched, later).await.expect("watch again");
    pause.disarm();
    go.notify_one();
    assert_eq!(
        pruning.await.expect("task").expect("prune"),
        2,
        "the idle cursor, then the one past the first round's bound"
    );
    let left = async |target: &SessionRef| {
        store
            .cursor(&w, &target.session_key)
            .await
            .expect("read")
            .is_some()
    };
    assert!(left(&touched).await, "touched stays");
    assert!(!left(&idle).await, "idle goes");
    assert!(
        !left(&past).await,
        "the one past the bound goes in the same chunk"
    );
}
