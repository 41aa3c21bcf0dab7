//! A ready [`HeartbeatWake`] that coalesces wakes per session on tokio's clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use awareness_core::SessionKey;
use tracing::{debug, warn};

use crate::ports::HeartbeatWake;

/// The gateway's default coalescing window.
pub const DEFAULT_WAKE_WINDOW: Duration = Duration::from_secs(20);

/// What actually wakes a session (the gateway's heartbeat runner).
pub type WakeSink = Arc<dyn Fn(&SessionKey, &str) + Send + Sync>;

/// Coalesces wakes: the first wake of a session fires at once; further wakes inside the window
/// fire once, at the window's end, with the reason of the last of them. Needs a tokio runtime
/// (it spawns the trailing wake). Dropping the waker ends its open windows: a trailing wake
/// still owed is not fired after it (the gateway may be shutting down), and the tasks that
/// would fire them end at once, letting go of the sink. A trailing wake on which the sink
/// panics (the first wake's panic goes to the caller) is logged and owed again at the end of
/// the next window: the line it was for waits in the queue, where nothing else would wake the
/// session for it.
pub struct CoalescingWake {
    window: Duration,
    sink: WakeSink,
    /// Each session with an open window, with the reason of the trailing wake it owes, if any.
    state: Arc<Mutex<HashMap<SessionKey, Option<String>>>>,
    /// Dropped with the waker, which ends every window's task (see [`CoalescingWake`]).
    alive: tokio::sync::watch::Sender<()>,
    /// Tests only: run by a window's task once its window has closed, before the task ends,
    /// where a wake on another thread may come in.
    #[cfg(test)]
    at_close: Option<AtClose>,
}

/// What a test runs at a window's close (see `CoalescingWake::at_close`).
#[cfg(test)]
type AtClose = Arc<dyn Fn(&SessionKey) + Send + Sync>;

impl std::fmt::Debug for CoalescingWake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoalescingWake")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl CoalescingWake {
    /// A waker with the default 20 s window.
    pub fn new(sink: WakeSink) -> Self {
        Self::with_window(DEFAULT_WAKE_WINDOW, sink)
    }

    /// A waker with its own window. A session woken inside its window is woken once more when
    /// the window ends, so the window bounds how long a wake can be held back: a window no
    /// timer reaches (`Duration::MAX`, or tokio's limit of about two years) wakes each session
    /// once and never again.
    pub fn with_window(window: Duration, sink: WakeSink) -> Self {
        Self {
            window,
            sink,
            state: Arc::default(),
            alive: tokio::sync::watch::Sender::new(()),
            #[cfg(test)]
            at_close: None,
        }
    }
}

impl HeartbeatWake for CoalescingWake {
    fn wake(&self, session: &SessionKey, reason: &str) {
        let mut g = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(trailing) = g.get_mut(session) {
            // Inside the window: one trailing wake at its end, for the latest reason.
            *trailing = Some(reason.to_owned());
            return;
        }
        g.insert(session.clone(), None);
        drop(g);
        // The window's task is spawned before the sink runs, and its guard ends the window
        // however the task ends (a panicking sink, an abort at shutdown): a window left open
        // would swallow every later wake of the session.
        let mut window = Window {
            state: Arc::clone(&self.state),
            session: session.clone(),
            closed: false,
            failed: 0,
        };
        let sink = Arc::clone(&self.sink);
        let period = self.window;
        let mut alive = self.alive.subscribe();
        #[cfg(test)]
        let at_close = self.at_close.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    // First: a window whose end came as the waker was dropped fires nothing.
                    biased;
                    // Nothing is ever sent: this answers only once the waker is dropped.
                    _ = alive.changed() => break,
                    () = tokio::time::sleep(period) => {}
                }
                // Dropped between the window's end and this task's turn: nothing either.
                if alive.has_changed().is_err() {
                    break;
                }
                let Some(reason) = window.take_trailing() else {
                    #[cfg(test)]
                    if let Some(hook) = &at_close {
                        hook(&window.session);
                    }
                    break;
                };
                let woken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    sink(&window.session, &reason);
                }));
                if let Err(panic) = woken {
                    // The sink failed (the host's heartbeat runner): the wake is still owed, and
                    // its line sits in the queue, where no pick-up looks again. It is owed
                    // again at the end of the window that has just started, unless a wake
                    // inside that window brings a reason of its own.
                    let message = awareness_core::error::panic_message(&*panic);
                    if window.owe_again(reason) {
                        warn!(session_key = %window.session, panic = message, "the trailing wake of a session panicked; it is tried again when the window ends");
                    } else {
                        debug!(session_key = %window.session, panic = message, "the trailing wake of a session panicked again; it is tried again when the window ends");
                    }
                } else {
                    window.failed = 0;
                }
            }
        });
        (self.sink)(session, reason);
    }
}

/// A session's open window; dropping it closes the window if it is still open.
struct Window {
    state: Arc<Mutex<HashMap<SessionKey, Option<String>>>>,
    session: SessionKey,
    /// Closed by [`Window::take_trailing`]: the session's entry may be another window's now.
    closed: bool,
    /// How many trailing wakes in a row the sink panicked on (the first is a warning, the
    /// others are logged at `debug`).
    failed: u32,
}

impl Window {
    /// At the window's end: the reason of the last wake that came inside it, if one did (it is
    /// then fired, and a new window starts); otherwise the window closes, in the same lock as
    /// the check, so that a wake coming right after starts a window of its own.
    fn take_trailing(&mut self) -> Option<String> {
        let mut g = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(reason) = g.get_mut(&self.session).and_then(Option::take) {
            return Some(reason);
        }
        g.remove(&self.session);
        self.closed = true;
        None
    }

    /// After the sink panicked on the trailing wake for `reason`: that wake is owed at the end
    /// of the window that its firing started (a wake that comes inside it sets the reason
    /// instead). Whether this is the first panic in a row.
    fn owe_again(&mut self, reason: String) -> bool {
        let mut g = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(trailing) = g.get_mut(&self.session) {
            trailing.get_or_insert(reason);
        }
        self.failed = self.failed.saturating_add(1);
        self.failed == 1
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if !self.closed {
            self.state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&self.session);
        }
    }
}

/// A [`HeartbeatWake`] that only counts wakes per session (for tests and dry runs).
#[derive(Debug, Default)]
pub struct RecordingWake {
    wakes: Mutex<Vec<SessionKey>>,
}

impl RecordingWake {
    /// A new, empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// How often `session` was woken.
    pub fn count(&self, session: &SessionKey) -> usize {
        self.lock().iter().filter(|s| *s == session).count()
    }

    /// Every wake, in order.
    pub fn all(&self) -> Vec<SessionKey> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SessionKey>> {
        self.wakes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl HeartbeatWake for RecordingWake {
    fn wake(&self, session: &SessionKey, _reason: &str) {
        self.lock().push(session.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn wakes_coalesce_within_the_window() {
        let rec = Arc::new(RecordingWake::new());
        let sink_rec = Arc::clone(&rec);
        let sink: WakeSink = Arc::new(move |s, r| sink_rec.wake(s, r));
        let waker = CoalescingWake::new(sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        for _ in 0..20 {
            waker.wake(&main, "session-state");
        }
        assert_eq!(rec.count(&main), 1, "the first wake fires at once");
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert_eq!(rec.count(&main), 2, "the other 19 became one trailing wake");
        tokio::time::sleep(Duration::from_mins(1)).await;
        assert_eq!(rec.count(&main), 2, "nothing more without new wakes");
        waker.wake(&main, "again");
        assert_eq!(
            rec.count(&main),
            3,
            "after the window a wake fires at once again"
        );
    }

    /// DESIGN.md "Delivery": wakes coalesce in a 20 s window by default. A wake 5 s after the
    /// first is held to the window's end, 20 s after the first; the wake that goes out then
    /// opens a window of its own, and a wake after that one closed goes out at once.
    #[tokio::test(start_paused = true)]
    async fn the_default_window_is_twenty_seconds() {
        let rec = Arc::new(RecordingWake::new());
        let sink_rec = Arc::clone(&rec);
        let sink: WakeSink = Arc::new(move |s, r| sink_rec.wake(s, r));
        let waker = CoalescingWake::new(sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        let start = tokio::time::Instant::now();
        let at = |secs: u64, millis: u64| {
            start + Duration::from_secs(secs) + Duration::from_millis(millis)
        };
        waker.wake(&main, "session-state");
        assert_eq!(rec.count(&main), 1, "the first wake fires at once");
        tokio::time::sleep_until(at(5, 0)).await;
        waker.wake(&main, "session-state");
        assert_eq!(rec.count(&main), 1, "5 s later: coalesced");
        tokio::time::sleep_until(at(19, 999)).await;
        assert_eq!(rec.count(&main), 1, "held until the window ends");
        tokio::time::sleep_until(at(20, 1)).await;
        assert_eq!(rec.count(&main), 2, "one heartbeat at the window's end");
        tokio::time::sleep_until(at(40, 1)).await;
        assert_eq!(rec.count(&main), 2, "nothing came in the second window");
        waker.wake(&main, "session-state");
        assert_eq!(
            rec.count(&main),
            3,
            "a wake after the window goes out at once"
        );
    }

    /// A waker with its own window holds a wake to that window's end, not the default's. (What
    /// the mutation did: every window lasted the default 20 s, whatever the waker was built with;
    /// review of stop 67, GB17.)
    #[tokio::test(start_paused = true)]
    async fn a_waker_holds_wakes_to_its_own_windows_end() {
        let (reasons, sink) = reasons_sink();
        let waker = CoalescingWake::with_window(Duration::from_secs(5), sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        let start = tokio::time::Instant::now();
        waker.wake(&main, "first");
        waker.wake(&main, "owed");
        tokio::time::sleep_until(start + Duration::from_millis(5_001)).await;
        assert_eq!(
            *reasons.lock().unwrap(),
            ["first", "owed"],
            "the trailing wake goes out at the 5 s window's end"
        );
    }

    /// A window shorter than a second is kept as given: the trailing wake goes out at its end.
    /// (What the mutation did: windows under a second held their trailing wake a full second, a
    /// gateway that coalesces over 100 ms woke its sessions up to ten times later than it asked;
    /// review of stop 71, GF14.)
    #[tokio::test(start_paused = true)]
    async fn a_window_under_a_second_holds_wakes_to_its_own_end() {
        let (reasons, sink) = reasons_sink();
        let waker = CoalescingWake::with_window(Duration::from_millis(100), sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        let start = tokio::time::Instant::now();
        waker.wake(&main, "first");
        waker.wake(&main, "owed");
        tokio::time::sleep_until(start + Duration::from_millis(101)).await;
        assert_eq!(
            *reasons.lock().unwrap(),
            ["first", "owed"],
            "the trailing wake goes out at the 100 ms window's end"
        );
    }

    /// A sink that keeps each wake's reason.
    fn reasons_sink() -> (Arc<Mutex<Vec<String>>>, WakeSink) {
        let reasons = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&reasons);
        let sink: WakeSink = Arc::new(move |_, r: &str| kept.lock().unwrap().push(r.to_owned()));
        (reasons, sink)
    }

    /// The trailing wake says why the session was last woken inside the window, not why it
    /// was first.
    #[tokio::test(start_paused = true)]
    async fn the_trailing_wake_carries_the_latest_reason() {
        let (reasons, sink) = reasons_sink();
        let waker = CoalescingWake::new(sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        waker.wake(&main, "first");
        waker.wake(&main, "second");
        waker.wake(&main, "third");
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert_eq!(*reasons.lock().unwrap(), ["first", "third"]);
    }

    /// Dropping the waker (a gateway shutting down) fires no trailing wake after it, and ends
    /// the window's task, which lets go of the sink at once.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_waker_fires_no_trailing_wake() {
        let (reasons, sink) = reasons_sink();
        let waker = CoalescingWake::new(Arc::clone(&sink));
        let main = SessionKey::new("agent:main:main").unwrap();
        waker.wake(&main, "first");
        waker.wake(&main, "owed");
        assert_eq!(Arc::strong_count(&sink), 3, "the waker's and its window's");
        drop(waker);
        // Let the window's task see the drop.
        tokio::task::yield_now().await;
        assert_eq!(Arc::strong_count(&sink), 1, "the window's task has ended");
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert_eq!(*reasons.lock().unwrap(), ["first"]);
    }

    /// Bug: a sink that panicked on a session's first wake left its window open for good (the
    /// task that closes it was spawned after the sink ran), and every later wake of the session
    /// was swallowed as "inside the window".
    #[tokio::test(start_paused = true)]
    async fn a_panicking_sink_does_not_swallow_later_wakes() {
        let rec = Arc::new(RecordingWake::new());
        let sink_rec = Arc::clone(&rec);
        let sink: WakeSink = Arc::new(move |s, r| {
            sink_rec.wake(s, r);
            assert!(sink_rec.count(s) > 1, "the heartbeat runner failed");
        });
        let waker = CoalescingWake::new(sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            waker.wake(&main, "session-state");
        }));
        assert!(first.is_err(), "the sink panicked");
        tokio::time::sleep(Duration::from_hours(1)).await;
        waker.wake(&main, "session-state");
        assert_eq!(rec.count(&main), 2, "the wake after the window fired");
    }

    /// Bug (review of stop 53): a sink that panicked on a trailing wake ended the window's
    /// task, and the wake was lost: the line it was for stays queued, so no pick-up delivers
    /// it again, and a main session takes no turn unless woken. It is now owed again at the
    /// next window's end, until the sink takes it, however many times in a row it panics.
    /// (What the mutation did: the third panic in a row gave the wake up; review of stop 71,
    /// GF17.)
    #[tokio::test(start_paused = true)]
    async fn a_trailing_wake_the_sink_panics_on_is_fired_again() {
        let reasons = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&reasons);
        let sink: WakeSink = Arc::new(move |_, r: &str| {
            let mut reasons = kept.lock().unwrap();
            reasons.push(r.to_owned());
            // The heartbeat runner fails on the second to the fourth wakes.
            let n = reasons.len();
            drop(reasons);
            assert!(!(2..=4).contains(&n), "the heartbeat runner failed");
        });
        let waker = CoalescingWake::new(sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        waker.wake(&main, "first");
        waker.wake(&main, "trailing");
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert_eq!(*reasons.lock().unwrap(), ["first", "trailing"], "panicked");
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(
            *reasons.lock().unwrap(),
            ["first", "trailing", "trailing"],
            "tried again at the next window's end, and panicked again"
        );
        tokio::time::sleep(Duration::from_secs(40)).await;
        assert_eq!(
            *reasons.lock().unwrap(),
            ["first", "trailing", "trailing", "trailing", "trailing"],
            "still owed after three panics in a row, then taken"
        );
        // A wake inside the window brings its own reason.
        waker.wake(&main, "latest");
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(reasons.lock().unwrap()[5], "latest", "taken");
        tokio::time::sleep(Duration::from_mins(2)).await;
        assert_eq!(reasons.lock().unwrap().len(), 6, "nothing more is owed");
        waker.wake(&main, "after");
        assert_eq!(
            reasons.lock().unwrap().len(),
            7,
            "the window closed: at once"
        );
    }

    /// The sink panicking on trailing wakes is warned of once per run of failures, and again
    /// when it fails after a wake it took: a run that ended is not the run going on (the
    /// count left as it was after a wake the sink took, as it was with its reset removed and
    /// every other test passing, logged a new failure at debug level, which nobody sees).
    #[tokio::test(start_paused = true)]
    async fn a_sink_failing_again_after_a_wake_it_took_is_warned_of_again() {
        let capture = awareness_core::testkit::logs::Capture::default();
        let _logs = capture.install();
        let taken = Arc::new(Mutex::new(0_usize));
        let kept = Arc::clone(&taken);
        let sink: WakeSink = Arc::new(move |_, _: &str| {
            let mut n = kept.lock().unwrap();
            *n += 1;
            let failing = [2, 3, 5].contains(&*n);
            drop(n);
            assert!(!failing, "the heartbeat runner failed");
        });
        let waker = CoalescingWake::new(sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        waker.wake(&main, "first");
        waker.wake(&main, "trailing");
        // At 20 s the trailing wake fails, at 40 s again, at 60 s it is taken.
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert_eq!(*taken.lock().unwrap(), 4);
        waker.wake(&main, "later");
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(*taken.lock().unwrap(), 5, "the later trailing wake failed");
        let said = |what: &str, level: &str| capture.said(&[what, level]);
        assert_eq!(
            said("panicked; it is tried again", "level=WARN"),
            2,
            "the first failure of each run: {:#?}",
            capture.lines()
        );
        assert_eq!(
            said("panicked again; it is tried again", "level=DEBUG"),
            1,
            "{:#?}",
            capture.lines()
        );
    }

    /// A window that closes with nothing owed ends its task, which lets the sink go, and fires
    /// nothing of a later window: a wake owed in a window opened after it goes out at that window's
    /// end, not earlier. (What the mutation did: the task went on to the next period instead of
    /// ending, every window ever opened kept a task and the sink, and an old task fired a later
    /// window's owed wake early; review of stop 63, W26.)
    #[tokio::test(start_paused = true)]
    async fn a_closed_windows_task_ends_and_fires_nothing_of_a_later_window() {
        let (reasons, sink) = reasons_sink();
        let waker = CoalescingWake::new(Arc::clone(&sink));
        let main = SessionKey::new("agent:main:main").unwrap();
        let start = tokio::time::Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        waker.wake(&main, "first");
        tokio::time::sleep_until(at(21)).await;
        assert_eq!(
            Arc::strong_count(&sink),
            2,
            "the test's and the waker's: the closed window's task has ended"
        );
        tokio::time::sleep_until(at(25)).await;
        waker.wake(&main, "second");
        tokio::time::sleep_until(at(30)).await;
        waker.wake(&main, "owed");
        tokio::time::sleep_until(at(44)).await;
        assert_eq!(
            *reasons.lock().unwrap(),
            ["first", "second"],
            "the wake owed in the window opened at 25 s waits for its end (45 s)"
        );
        tokio::time::sleep_until(at(46)).await;
        assert_eq!(*reasons.lock().unwrap(), ["first", "second", "owed"]);
    }

    /// A window whose task ends with its runtime (a host that shuts a runtime down and goes on with
    /// the waker in another) is closed: the next wake of the session goes out at once instead of
    /// being held for a window no task will end. (What the mutation did: a dropped task left its
    /// window open, and every later wake of the session was swallowed; review of stop 63, W22.)
    #[test]
    fn a_window_ended_with_its_runtime_does_not_swallow_later_wakes() {
        let rec = Arc::new(RecordingWake::new());
        let sink_rec = Arc::clone(&rec);
        let sink: WakeSink = Arc::new(move |s, r| sink_rec.wake(s, r));
        let waker = CoalescingWake::new(sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap()
        };
        runtime().block_on(async { waker.wake(&main, "first") });
        runtime().block_on(async { waker.wake(&main, "second") });
        assert_eq!(
            rec.count(&main),
            2,
            "the window ended with its runtime: the second wake goes out at once"
        );
    }

    /// A wake that comes after a window closed, before its task has ended (on another thread;
    /// here from a hook the task runs at that point), opens a window that the old task's end
    /// leaves open: a wake inside the new window is held to its end. (What the mutation did:
    /// the closed mark not set, the old task's end removed the new window, and the next wake
    /// went out at once; review of stop 63, W21.)
    #[tokio::test(start_paused = true)]
    async fn a_window_opened_as_the_last_one_closes_is_kept() {
        let (reasons, sink) = reasons_sink();
        let mut waker = CoalescingWake::new(sink);
        // The hook wakes through the waker that holds it: a weak reference, so that the waker
        // is dropped at the test's end.
        let cell: Arc<std::sync::OnceLock<std::sync::Weak<CoalescingWake>>> = Arc::default();
        let waker_of_hook = Arc::clone(&cell);
        let once = Arc::new(std::sync::atomic::AtomicBool::new(false));
        waker.at_close = Some(Arc::new(move |s: &SessionKey| {
            if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let waker = waker_of_hook.get().and_then(std::sync::Weak::upgrade);
                waker
                    .expect("the test holds the waker")
                    .wake(s, "as it closed");
            }
        }));
        let waker = Arc::new(waker);
        assert!(cell.set(Arc::downgrade(&waker)).is_ok());
        let main = SessionKey::new("agent:main:main").unwrap();
        let start = tokio::time::Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        waker.wake(&main, "first");
        tokio::time::sleep_until(at(21)).await;
        assert_eq!(
            *reasons.lock().unwrap(),
            ["first", "as it closed"],
            "the wake as the window closed goes out at once"
        );
        waker.wake(&main, "held");
        assert_eq!(
            *reasons.lock().unwrap(),
            ["first", "as it closed"],
            "a wake inside the window the closing one opened is held"
        );
        tokio::time::sleep_until(at(41)).await;
        assert_eq!(*reasons.lock().unwrap(), ["first", "as it closed", "held"]);
    }

    /// A wake that comes while the sink runs a trailing wake it then panics on (here asked by the
    /// sink itself) is the wake owed again, with its own reason, not the failed wake's. (What the
    /// mutation did: the failed wake's reason overwrote it, against `owe_again`'s doc; review of
    /// stop 63, W18.)
    #[tokio::test(start_paused = true)]
    async fn a_wake_during_a_failing_trailing_wake_keeps_its_reason() {
        let reasons = Arc::new(Mutex::new(Vec::<String>::new()));
        let cell: Arc<std::sync::OnceLock<Arc<CoalescingWake>>> = Arc::default();
        let (kept, waker_of_sink) = (Arc::clone(&reasons), Arc::clone(&cell));
        let sink: WakeSink = Arc::new(move |s: &SessionKey, r: &str| {
            kept.lock().unwrap().push(r.to_owned());
            if r == "failing" {
                waker_of_sink.get().unwrap().wake(s, "newer");
                panic!("the heartbeat runner failed");
            }
        });
        let waker = Arc::new(CoalescingWake::new(sink));
        assert!(cell.set(Arc::clone(&waker)).is_ok());
        let main = SessionKey::new("agent:main:main").unwrap();
        waker.wake(&main, "first");
        waker.wake(&main, "failing");
        tokio::time::sleep(Duration::from_secs(41)).await;
        assert_eq!(
            *reasons.lock().unwrap(),
            ["first", "failing", "newer"],
            "the wake owed again carries the newer wake's reason"
        );
    }

    /// A recorder gives every wake in the order they came. (What the mutation did: `all` gave
    /// them newest first, a dry run showed the sessions woken in the wrong order; review of
    /// stop 68, GD13.)
    #[test]
    fn a_recorder_gives_the_wakes_in_order() {
        let rec = RecordingWake::new();
        let (main, ops) = (
            SessionKey::new("agent:main:main").unwrap(),
            SessionKey::new("agent:ops:main").unwrap(),
        );
        rec.wake(&main, "first");
        rec.wake(&ops, "second");
        assert_eq!(rec.all(), [main, ops], "oldest first");
    }

    /// A waker with a window longer than the default holds a wake to that window's end, not to
    /// the default's. (What the mutation did: windows capped at the default 20 s, a gateway that
    /// chose a 60 s window to spare its heartbeat runner was woken three times as often; review
    /// of stop 68, GD14.)
    #[tokio::test(start_paused = true)]
    async fn a_window_longer_than_the_default_holds_wakes_to_its_end() {
        let (reasons, sink) = reasons_sink();
        let waker = CoalescingWake::with_window(Duration::from_mins(1), sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        let start = tokio::time::Instant::now();
        waker.wake(&main, "first");
        waker.wake(&main, "owed");
        tokio::time::sleep_until(start + Duration::from_secs(59)).await;
        assert_eq!(
            *reasons.lock().unwrap(),
            ["first"],
            "held until the 60 s window ends"
        );
        tokio::time::sleep_until(start + Duration::from_secs(61)).await;
        assert_eq!(*reasons.lock().unwrap(), ["first", "owed"]);
    }

    /// A sink may wake another session from inside a session's first wake (a heartbeat runner
    /// that wakes the parent too): the waker's lock is not held while the sink runs. (What the
    /// mutation did: the lock was held across the sink, and such a sink deadlocked the gateway;
    /// review of stop 70, GE13.)
    #[test]
    fn a_sink_may_wake_another_session_from_a_first_wake() {
        let (reasons, inner) = reasons_sink();
        let cell: Arc<std::sync::OnceLock<std::sync::Weak<CoalescingWake>>> = Arc::default();
        let waker_of_sink = Arc::clone(&cell);
        let sink: WakeSink = Arc::new(move |s: &SessionKey, r: &str| {
            inner(s, r);
            if r == "child" {
                let parent = SessionKey::new("agent:main:main").unwrap();
                let waker = waker_of_sink.get().and_then(std::sync::Weak::upgrade);
                waker
                    .expect("the test holds the waker")
                    .wake(&parent, "parent");
            }
        });
        let waker = Arc::new(CoalescingWake::new(sink));
        assert!(cell.set(Arc::downgrade(&waker)).is_ok());
        let (done, finished) = std::sync::mpsc::channel();
        let waking = Arc::clone(&waker);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            runtime.block_on(async {
                let child = SessionKey::new("agent:main:subagent:c").unwrap();
                waking.wake(&child, "child");
            });
            let _ = done.send(());
        });
        // Only a deadlock makes this wait out its bound.
        finished
            .recv_timeout(Duration::from_mins(1))
            .expect("the wake from inside the sink returned");
        assert_eq!(*reasons.lock().unwrap(), ["child", "parent"]);
    }

    /// A sink that panics on a session's first wake leaves that wake's window open: a wake
    /// inside it is held to its end, as after a first wake the sink took. (What the mutation
    /// did: the sink ran before the window's task was spawned, the panic closed the window, and
    /// every wake of a failing heartbeat runner went out at once, none coalesced; review of
    /// stop 68, GD32.)
    #[tokio::test(start_paused = true)]
    async fn a_first_wake_the_sink_panics_on_keeps_its_window() {
        let reasons = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&reasons);
        let sink: WakeSink = Arc::new(move |_, r: &str| {
            kept.lock().unwrap().push(r.to_owned());
            assert_ne!(r, "first", "the heartbeat runner failed");
        });
        let waker = CoalescingWake::new(sink);
        let main = SessionKey::new("agent:main:main").unwrap();
        let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            waker.wake(&main, "first");
        }));
        assert!(first.is_err(), "the sink panicked");
        waker.wake(&main, "inside");
        assert_eq!(
            *reasons.lock().unwrap(),
            ["first"],
            "a wake inside the window is held"
        );
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert_eq!(*reasons.lock().unwrap(), ["first", "inside"]);
    }
}
