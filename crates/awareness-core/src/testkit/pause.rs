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
