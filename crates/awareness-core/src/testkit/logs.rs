//! A log capture for tests: every `tracing` event as one line of its fields and its level
//! (`message=... path=... level=WARN`), for a test that asserts what a store or a service logs.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Metadata, Subscriber};

/// Keeps every log event as one line: `name=value ` for each field (a value logged with `%`
/// as its `Display`, with `?` as its `Debug`), then ` level=LEVEL`. Spans are not kept. (The
/// process-wide capture, [`Capture::warnings`], keeps warnings and errors only.)
#[derive(Debug, Clone)]
pub struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
    /// The least severe level kept.
    least: tracing::Level,
}

impl Default for Capture {
    fn default() -> Self {
        Self {
            lines: Arc::default(),
            least: tracing::Level::TRACE,
        }
    }
}

impl Capture {
    /// The lines captured so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many lines captured so far say every one of `parts`.
    pub fn said(&self, parts: &[&str]) -> usize {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .count()
    }

    /// The process-wide subscriber of a test binary, set once, which keeps the warnings and
    /// errors logged on any thread without a subscriber of its own (a store's on tokio's
    /// blocking pool, say). Every test of the binary shares it, so a test picks out its own
    /// lines (by the file they name, for instance). Where another process-wide subscriber was
    /// set first, it keeps nothing.
    pub fn warnings() -> Self {
        static GLOBAL: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();
        let global = GLOBAL.get_or_init(|| {
            let global = Capture {
                lines: Arc::default(),
                least: tracing::Level::WARN,
            };
            // Another global subscriber set first would want every call site too, or not:
            // then this keeps nothing, and the checks that read it fail, saying so.
            let _ = tracing::subscriber::set_global_default(global.clone());
            tracing::callsite::rebuild_interest_cache();
            global
        });
        global.clone()
    }

    /// Makes this the subscriber of the calling thread until the guard is dropped: for code
    /// that logs on the test's own thread (a current-thread runtime).
    ///
    /// `tracing` caches, per log call site, whether any subscriber wants it. A call site first
    /// reached by another test's thread while this thread's subscriber was being installed
    /// could be cached as wanted by nobody, and the test would then see none of its lines
    /// (seen under load: "left: 0, right: 1"). So the process-wide subscriber, which wants
    /// every call site ([`Capture::warnings`]), is installed first, once (unless another is
    /// already set): no call site is ever cached as unwanted.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        let _ = Self::warnings();
        let guard = tracing::subscriber::set_default(self.clone());
        tracing::callsite::rebuild_interest_cache();
        guard
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
        // Levels compare by verbosity: TRACE is the greatest.
        if *event.metadata().level() > self.least {
            return;
        }
        let mut line = Line(String::new());
        event.record(&mut line);
        // The level last, so that a line still begins with its message.
        let _ = write!(line.0, " level={}", event.metadata().level());
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
