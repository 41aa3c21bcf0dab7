//! Helpers for the end-to-end tests: where the shared fixtures are, and every backend as a
//! fresh store on a real file.
//!
//! ```
//! let dir = awareness_e2e::shared_dir();
//! assert!(dir.join("fixtures").is_dir(), "{}", dir.display());
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::AwarenessStore;

/// The project's `shared/` folder: `$AWARENESS_SHARED_DIR`, else `../shared` beside the checkout.
pub fn shared_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("AWARENESS_SHARED_DIR") {
        return PathBuf::from(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("shared")
}

/// The OpenClaw fixture folder.
pub fn openclaw_fixture_dir() -> PathBuf {
    shared_dir().join("fixtures").join("openclaw-2026.9.6")
}

/// A fresh store of one backend and what keeps its files alive.
pub struct Backend {
    /// Backend name.
    pub name: &'static str,
    /// Its store URL (for reopening the same file as a "restart").
    pub url: String,
    /// The store.
    pub store: Arc<dyn AwarenessStore>,
    /// Keeps the temporary directory.
    pub dir: tempfile::TempDir,
}

/// Every backend compiled in, each on a fresh file in its own temporary directory.
pub async fn backends() -> Vec<Backend> {
    let mut out = Vec::new();
    for (name, url_of) in BACKENDS {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = url_of(&dir);
        let store = gateway_adapter::open_store(&url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
        out.push(Backend {
            name,
            url,
            store,
            dir,
        });
    }
    out
}

type UrlOf = fn(&tempfile::TempDir) -> String;

const BACKENDS: &[(&str, UrlOf)] = &[
    ("memory", |_| "memory:".to_owned()),
    ("sqlite", |d| {
        format!("sqlite://{}", d.path().join("state.db").display())
    }),
    ("redb", |d| {
        format!("redb://{}", d.path().join("state.redb").display())
    }),
];
