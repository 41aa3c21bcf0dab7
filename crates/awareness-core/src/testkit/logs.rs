//! A log capture for tests: every `tracing` event as one line of its fields and its level
//! (`message=... path=... level=WARN`), for a test that asserts what a store or a service logs.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Metadata, Subscriber};

/// Keeps every log event as one line: `name=value ` for each field (a value logged with `%`
/// as its `Display`, with `?` as its `Debug`), then ` level=LEVEL`. Spans are not kept.
/// (`Capture(None)` wants every event and keeps none: see [`Capture::install`].)
#[derive(Debug, Clone)]
pub struct Capture(Option<Arc<Mutex<Vec<String>>>>);

impl Default for Capture {
    fn default() -> Self {
        Self(Some(Arc::default()))
    }
}

impl Capture {
    /// The lines captured so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.as_ref().map_or_else(Vec::new, |lines| {
            lines.lock().unwrap_or_else(PoisonError::into_inner).clone()
        })
    }

    /// Makes this the subscriber of the calling thread until the guard is dropped: for code
    /// that logs on the test's own thread (a current-thread runtime).
    ///
    /// `tracing` caches, per log call site, whether any subscriber wants it. A call site first
    /// reached by another test's thread while this thread's subscriber was being installed
    /// could be cached as wanted by nobody, and the test would then see none of its lines
    /// (seen under load: "left: 0, right: 1"). So a process-wide subscriber that wants every
    /// call site and keeps nothing (`Capture(None)`) is installed first, once (unless another is
    /// already set):
    /// no call site is ever cached as unwanted.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        static GLOBAL: std::sync::Once = std::sync::Once::new();
        GLOBAL.call_once(|| {
            // Another global subscriber set first would do as well.
            let _ = tracing::subscriber::set_global_default(Capture(None));
        });
        let guard = tracing::subscriber::set_default(self.clone());
        tracing::callsite::rebuild_interest_cache();
        guard
    }

    /// A new capture made the process-wide subscriber, for code that logs on other threads (a
    /// store working on tokio's blocking pool). There is one per process: a test binary using
    /// it holds that one test, so that what it captures is that test's.
    ///
    /// # Panics
    /// When a process-wide subscriber is already set.
    pub fn install_globally() -> Self {
        let capture = Self::default();
        tracing::subscriber::set_global_default(capture.clone())
            .expect("no other process-wide subscriber is set in this test binary");
        tracing::callsite::rebuild_interest_cache();
        capture
    }
}

/// One event's fields, as `name=value ` each.
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let Some(lines) = &self.0 else { return };
        let mut line = Line(String::new());
        event.record(&mut line);
        // The level last, so that a line still begins with its message.
        let _ = write!(line.0, " level={}", event.metadata().level());
        lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
