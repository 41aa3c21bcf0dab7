//! A property-based model of the delivery protocol (DESIGN.md section 4, "Watchers, cursors and
//! the notice protocol" and its "Delivery" part; decisions 0002, 0003, 0014, 0019), including
//! turns that a host's timeout drops.
//!
//! Random sequences of 1 to 40 operations run one after another (one task, a current-thread
//! runtime, nothing concurrent) against an [`Awareness`] over a `MemoryStore`, with an
//! [`InMemoryQueue`], a [`RecordingWake`] and an [`InMemoryDirectory`], and against a plain
//! model: the cursors' three sequences as section 4 states the rules (seed, explicit watch,
//! unwatch, material event, acknowledge, reset, delete), the targets' heads, the run ids a
//! spawn deduplicates on, and a little bookkeeping about the queue.
//!
//! The universe: three watchers, `agent:main:main` and `agent:ops:main` (main sessions, woken)
//! and `agent:main:subagent:lead` (a nested subagent, never woken); the gateway's directory
//! knows the first and the last (this gateway's), not `agent:ops:main` (another gateway's, for
//! the pick-up). Three targets: `agent:main:subagent:worker`, whose directory entry says
//! `agent:main:main` spawned it; `agent:main:subagent:lead:subagent:helper`, spawned by the
//! subagent; `agent:ops:subagent:scout`, with no entry (only spawns and watches make it
//! watched). Any watcher may also spawn any target (`subagent_spawned`, its run id drawn from a
//! small pool, so that a run id used before deduplicates).
//!
//! The operations: a person's message into a target (`human_message`), a spawn
//! (`subagent_spawned`), a watch (`watch_after_send`, dispatched) and an unwatch
//! (`try_unwatch`), a watcher's turn (`drain_turn`), a dropped turn (`drain_turn`'s future
//! polled 0 to 6 times, then dropped, as a host's turn timeout does; the tasks it spawned run
//! after each poll or only once it is dropped), a pick-up (`pick_up`), a lost line
//! (`take_queued`, its lines thrown away), a reset of a watcher (`on_reset`) and a deletion of
//! a target (`on_delete`).
//!
//! A dropped turn is modelled as having shown nothing. A turn that ends within its polls is a
//! turn like any other; one never polled did nothing. With the in-memory store a turn's first
//! poll runs up to its acknowledgement and waits for that task, so a turn dropped after one or
//! more polls took the notices of its watcher's pending cursors (and what an earlier dropped
//! turn left), and its acknowledgement commits and queues its follow-ups all the same
//! (decision 0003, "a turn whose caller gives up"): the cursor invariant below checks that.
//!
//! The invariants, checked after every step:
//!
//! - **cursors**: the store's cursors are exactly what section 4's rules make of the operations
//!   (seed at the spawn's sequence unless a notice is pending; watch at the target's head,
//!   keeping an existing cursor; a material event freezes `notified` only when no notice is
//!   outstanding and always moves `material`; a named spawner without a cursor starts at 0,
//!   decision 0002; an acknowledgement sets `last_seen := notified` and re-freezes at
//!   `material` for exactly one follow-up; reset and delete remove, section 6 "Lifecycle"; a
//!   deduplicated spawn touches no cursor, section 3). A person's message is recorded exactly
//!   when the target has a spawner or a watcher (`human_message`'s docs).
//! - **notify once, in the queue**: every session-state line in a watcher's queue is the
//!   current notice (DESIGN's exact text and context key) of one of its pending cursors, except
//!   a line queued before the cursor on its target was removed (unwatch, reset, deletion):
//!   such a line is stale and the next turn leaves it out (decision 0003, step 4). So a queue
//!   never holds two live lines for one target ("tells each affected session once", "20 rapid
//!   changes produce one line").
//! - **notify once, in a turn**: a turn never returns two session-state lines of its own for
//!   one target, and returns exactly the notices of the watcher's pending cursors: stale lines
//!   left out, lost ones put back (decision 0003: "A pending cursor always surfaces on the
//!   watcher's next turn"); besides, it returns the lines dropped turns took (next item),
//!   which may be about the same targets.
//! - **what a dropped turn took**: every notice that was pending or queued when a dropped
//!   turn began (it took them, acknowledged them, and showed nothing) is shown by the watcher's
//!   next turn, ahead of every other line (decision 0003, update "a turn whose caller gives
//!   up": "what the turn had taken stays with the watcher's turn lock for the next turn ...
//!   which the next turn returns first"; `drain_turn`: "goes to the watcher's next turn, which
//!   returns it first"), also after further dropped turns. Conservatively, one whose cursor an
//!   unwatch or a deletion of its target removed since need not be shown (it may be: only a
//!   reset or a deletion of the watcher drops such lines, and no watcher here is deleted). A
//!   turn shows nothing but these lines and the notices of the pending cursors.
//! - **a notice is shown once**, across turns, dropped ones included: no turn shows one notice
//!   twice, nor a notice an earlier turn of the watcher showed, until a change on its target
//!   (`drain_turn`: "So the watcher is told each notice once"; decision 0003 on what a dropped
//!   turn took: "a notice among them is not shown twice if its acknowledgement did not
//!   commit", and once it did, its cursor no longer shows it). A target may be shown again
//!   with no change between the turns, by the follow-up of a change that came after its notice
//!   was frozen (DESIGN 4): a follow-up is a notice of its own, with a text of its own; after a
//!   dropped turn the next turn shows the notice and its follow-up together.
//! - **a reset drops what a dropped turn took**: no turn after a reset shows what a dropped
//!   turn took before it (decision 0003, stop 37 and 38 updates: "A reset drops only what a
//!   dropped turn took before the reset began", its session-state notices; `tests/turn.rs`
//!   `a_reset_drops_what_a_dropped_turn_left`): checked by the **reset** invariant below and,
//!   once a cursor is pending again, by a turn showing only the notices of pending cursors.
//! - **nothing lost**: every pending cursor's notice is in its watcher's queue, unless a lost
//!   line (`take_queued`) took it and nothing has delivered it again since: a change on its
//!   target (decision 0002: every material event re-delivers), the watcher's turn, or a pick-up
//!   when the gateway owns the watcher. So after a pick-up every pending cursor of an owned
//!   watcher has its line queued (decision 0014; DESIGN 9, item 7); a pick-up queues nothing for
//!   a watcher the directory does not know (DESIGN 9.1), and reports the lines it queued.
//! - **a turn acknowledges what it showed**: after a turn no cursor it showed is pending except
//!   for exactly one follow-up where a change came after the frozen notice (checked through the
//!   cursors above: "acknowledges the session-state entries it drained (and only those)",
//!   decision 0019); a next turn with no change in between shows exactly those follow-ups, and
//!   one after it nothing.
//! - **reset**: a reset watcher has no cursors (section 6), and its turns show no
//!   session-state line until one of its cursors is pending again.
//! - **wakes**: a main session is woken once for each session-state line its queue gained, and
//!   not otherwise ("a main-session watcher is woken at once"; `pick_up`: "a line already queued
//!   is not queued twice and wakes nobody"); a nested subagent watcher is never woken.
//! - **owed wakes**: besides, the first pick-up after a dropped turn of a main session took
//!   notices wakes that session once more, when the gateway's directory knows it (decision
//!   0003, stop 48: "the next pick-up ... wakes such a session once, unless a turn, a reset or
//!   a deletion took the lines first"; `pick_up`: "It also wakes, once, a main session whose
//!   turn was dropped after acknowledging what it read"; DESIGN 9.1: a gateway delivers only to
//!   the watchers it owns). A turn or a reset of the session in between owes nothing; an
//!   unwatch or a deletion of a target takes no lines, and owes the wake still; a later
//!   pick-up wakes it no more; nor does a pick-up that woke it for lines it queued (`pick_up`
//!   pays the debt with that wake: the turn it brings shows both); a nested subagent, or a
//!   session the directory does not know, is not woken for it (that pick-up settles its debt
//!   all the same). Since stop 53 the dropped turn's acknowledgement pays the wake itself as it
//!   lets the turn's lock go, when the turn was dropped before it ended (a pick-up made while
//!   it held the lock could not look): the model takes the wake from whichever paid it, and
//!   checks it is paid once.
//!
//! `PROPTEST_CASES` cases (default 256); `PROPTEST_RNG_SEED` runs the cases of a failure again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use awareness_core::testkit::proptest;
use awareness_core::{CursorFilter, CursorStore as _, SessionKey, SessionRef};
use gateway_adapter::{
    Awareness, HumanMessage, InMemoryDirectory, InMemoryQueue, PickUp, QueuedEntry, RecordingWake,
    SessionEntry, SystemEventQueue,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use store_memory::MemoryStore;

mod common;
use common::settle;

/// Watcher sessions: two main sessions and a nested subagent.
const WATCHERS: [&str; 3] = [
    "agent:main:main",
    "agent:ops:main",
    "agent:main:subagent:lead",
];
/// Whether the gateway's directory knows the watcher (it is this gateway's).
const OWNED: [bool; 3] = [true, false, true];
/// Target sessions.
const TARGETS: [&str; 3] = [
    "agent:main:subagent:worker",
    "agent:main:subagent:lead:subagent:helper",
    "agent:ops:subagent:scout",
];
/// Each target's agent.
const TARGET_AGENTS: [&str; 3] = ["main", "main", "ops"];
/// The watcher each target's directory entry names as its spawner.
const SPAWNER: [Option<usize>; 3] = [Some(0), Some(2), None];
/// How many run ids a spawn draws from.
const RUNS: u8 = 4;
/// At most how many times a dropped turn is polled before it is dropped.
const MAX_POLLS: u8 = 6;

/// One operation of a case (indices into [`WATCHERS`] and [`TARGETS`]).
#[derive(Clone, Copy)]
enum Op {
    /// A person's message into the target.
    Human { target: usize },
    /// The watcher spawns the target (`child_spawned`, run id `run-<run>`).
    Spawn {
        watcher: usize,
        target: usize,
        run: u8,
    },
    /// `sessions_send` with `watch: true`, dispatched.
    Watch { watcher: usize, target: usize },
    /// Unwatch.
    Unwatch { watcher: usize, target: usize },
    /// The watcher's turn.
    Turn { watcher: usize },
    /// The watcher's turn, its future dropped after `polls` polls (a host's turn timeout):
    /// with `between`, the spawned tasks run after each poll, else only once it is dropped.
    DropTurn {
        watcher: usize,
        polls: u8,
        between: bool,
    },
    /// A pick-up.
    PickUp,
    /// Something takes the watcher's queued lines and loses them.
    LoseLines { watcher: usize },
    /// The watcher's session is reset.
    Reset { watcher: usize },
    /// The target's session is deleted.
    Delete { target: usize },
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Op::Human { target } => write!(f, "Human({})", TARGETS[target]),
            Op::Spawn {
                watcher,
                target,
                run,
            } => write!(
                f,
                "Spawn({} spawns {}, run-{run})",
                WATCHERS[watcher], TARGETS[target]
            ),
            Op::Watch { watcher, target } => {
                write!(f, "Watch({} -> {})", WATCHERS[watcher], TARGETS[target])
            }
            Op::Unwatch { watcher, target } => {
                write!(f, "Unwatch({} -> {})", WATCHERS[watcher], TARGETS[target])
            }
            Op::Turn { watcher } => write!(f, "Turn({})", WATCHERS[watcher]),
            Op::DropTurn {
                watcher,
                polls,
                between,
            } => write!(
                f,
                "DropTurn({}, dropped after {polls} poll(s){})",
                WATCHERS[watcher],
                if between {
                    ", the tasks run after each"
                } else {
                    ""
                }
            ),
            Op::PickUp => write!(f, "PickUp"),
            Op::LoseLines { watcher } => write!(f, "LoseLines({})", WATCHERS[watcher]),
            Op::Reset { watcher } => write!(f, "Reset({})", WATCHERS[watcher]),
            Op::Delete { target } => write!(f, "Delete({})", TARGETS[target]),
        }
    }
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let w = || 0..WATCHERS.len();
    let t = || 0..TARGETS.len();
    prop_oneof![
        6 => t().prop_map(|target| Op::Human { target }),
        2 => (w(), t(), 0..RUNS).prop_map(|(watcher, target, run)| Op::Spawn { watcher, target, run }),
        2 => (w(), t()).prop_map(|(watcher, target)| Op::Watch { watcher, target }),
        1 => (w(), t()).prop_map(|(watcher, target)| Op::Unwatch { watcher, target }),
        4 => w().prop_map(|watcher| Op::Turn { watcher }),
        4 => (w(), 0..=MAX_POLLS, any::<bool>())
            .prop_map(|(watcher, polls, between)| Op::DropTurn { watcher, polls, between }),
        2 => Just(Op::PickUp),
        2 => w().prop_map(|watcher| Op::LoseLines { watcher }),
        1 => w().prop_map(|watcher| Op::Reset { watcher }),
        1 => t().prop_map(|target| Op::Delete { target }),
    ]
}

fn key(s: &str) -> SessionKey {
    SessionKey::new(s).expect("valid key")
}

fn watcher_key(w: usize) -> SessionKey {
    key(WATCHERS[w])
}

fn target_key(t: usize) -> SessionKey {
    key(TARGETS[t])
}

fn is_main(w: usize) -> bool {
    !WATCHERS[w].contains(":subagent:")
}

/// DESIGN.md's context key: `session-state:<lowercase hex of the target key's UTF-8 bytes>`.
fn context_key(t: usize) -> String {
    use std::fmt::Write as _;
    TARGETS[t]
        .bytes()
        .fold(String::from("session-state:"), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// DESIGN.md's notice line (exact text) for target `t` at `last_seen`.
fn line(t: usize, last_seen: u64) -> QueuedEntry {
    let target = TARGETS[t];
    QueuedEntry {
        text: format!(
            "Session \"{target}\" changed (other actor). Reconcile before acting: session_status sessionKey \"{target}\" changesSince {last_seen}."
        ),
        context_key: Some(context_key(t)),
    }
}

/// The target a session-state line is about, by its context key.
fn target_of(entry: &QueuedEntry) -> Option<usize> {
    let ck = entry.context_key.as_deref()?;
    (0..TARGETS.len()).find(|&t| context_key(t) == ck)
}

/// A cursor's three sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seqs {
    last_seen: u64,
    notified: u64,
    material: u64,
}

impl Seqs {
    fn at(seq: u64) -> Self {
        Self {
            last_seen: seq,
            notified: seq,
            material: seq,
        }
    }

    /// DESIGN 4: "A notice is pending when material > last_seen."
    fn pending(self) -> bool {
        self.material > self.last_seen
    }

    /// DESIGN 4, material event: freeze `notified` when no notice is outstanding; always move
    /// `material`.
    fn material_event(&mut self, seq: u64) {
        if self.notified == self.last_seen {
            self.notified = seq;
        }
        self.material = seq;
    }

    /// DESIGN 4, acknowledge: `last_seen := notified`, then one follow-up when `material` is
    /// above it. Whether a follow-up was handed out.
    fn acknowledge(&mut self) -> bool {
        self.last_seen = self.notified;
        if self.material > self.notified {
            self.notified = self.material;
            return true;
        }
        false
    }
}

/// The model of one case.
#[derive(Default)]
struct Model {
    /// (watcher, target) to the cursor's sequences.
    cursors: BTreeMap<(usize, usize), Seqs>,
    /// Each target's head (0: nothing recorded, or deleted).
    heads: [u64; 3],
    /// Run ids whose `child_spawned` is stored: its target and sequence.
    runs: BTreeMap<u8, (usize, u64)>,
    /// Pending cursors whose line a lost line took, not delivered again since.
    lost: BTreeSet<(usize, usize)>,
    /// Per watcher, lines queued before the cursor on their target was removed (stale).
    excused: [Vec<QueuedEntry>; 3],
    /// Per watcher: reset, and no cursor of it pending since.
    reset_quiet: [bool; 3],
    /// Per watcher: its cursors as its last turn left them (`None` after a dropped turn).
    after_turn: [Option<BTreeMap<usize, Seqs>>; 3],
    /// Per watcher: the lines dropped turns of it took that no turn has shown since, which its
    /// next turn returns first, unless a reset dropped them.
    carried: [Vec<Took>; 3],
    /// Per watcher: a dropped turn left it lines holding a notice that wakes, and no pick-up,
    /// turn or reset has taken that debt since.
    wake_owed: [bool; 3],
    /// Per watcher, for the step being checked: its pick-up paid an owed wake.
    owed_woken: [bool; 3],
    /// Per watcher, for the step being checked: the acknowledgement of its dropped turn paid
    /// the wake the turn owes, as it let the turn's lock go (stop 53).
    let_go_woken: [bool; 3],
    /// Per (watcher, target): the notices (their text) the watcher's turns showed about the
    /// target since the last change on it.
    shown: BTreeMap<(usize, usize), BTreeSet<String>>,
}

/// A line a dropped turn took.
#[derive(Debug, Clone)]
struct Took {
    target: usize,
    line: QueuedEntry,
    /// The watcher's next turn must show it: its cursor is still there (a line whose cursor
    /// an unwatch or a deletion of the target removed since may be shown or not).
    owed: bool,
}

impl Model {
    fn of_watcher(&self, w: usize) -> BTreeMap<usize, Seqs> {
        self.cursors
            .iter()
            .filter(|((cw, _), _)| *cw == w)
            .map(|((_, t), c)| (*t, *c))
            .collect()
    }

    /// The current notices of the watcher's pending cursors.
    fn current_lines(&self, w: usize) -> Vec<QueuedEntry> {
        self.of_watcher(w)
            .into_iter()
            .filter(|(_, c)| c.pending())
            .map(|(t, c)| line(t, c.last_seen))
            .collect()
    }
}

struct World {
    store: Arc<MemoryStore>,
    queue: Arc<InMemoryQueue>,
    wake: Arc<RecordingWake>,
    svc: Awareness,
}

fn world() -> World {
    let store = Arc::new(MemoryStore::new());
    let queue = Arc::new(InMemoryQueue::new());
    let wake = Arc::new(RecordingWake::new());
    let directory = Arc::new(InMemoryDirectory::new());
    for (w, owned) in OWNED.iter().enumerate() {
        if *owned {
            directory.upsert(watcher_key(w), SessionEntry::default());
        }
    }
    for (t, spawner) in SPAWNER.iter().enumerate() {
        if let Some(s) = spawner {
            directory.upsert(
                target_key(t),
                SessionEntry {
                    spawned_by: Some(watcher_key(*s)),
                    ..SessionEntry::default()
                },
            );
        }
    }
    let svc = Awareness::builder(store.clone(), queue.clone(), wake.clone(), directory).build();
    World {
        store,
        queue,
        wake,
        svc,
    }
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

/// Applies `op` to the service and the model, checking what the call answers.
async fn apply(world: &World, m: &mut Model, op: Op) -> Result<(), TestCaseError> {
    match op {
        Op::Human { target } => {
            let recorded = world
                .svc
                .human_message(HumanMessage::new(target_key(target)))
                .await;
            let spawner = SPAWNER[target];
            let watched = m.cursors.keys().any(|(_, t)| *t == target);
            prop_assert_eq!(
                recorded.is_some(),
                spawner.is_some() || watched,
                "a person's message is recorded exactly when the session has a spawner or a watcher"
            );
            let Some(event) = recorded else {
                return Ok(());
            };
            let seq = event.sequence.0;
            m.heads[target] = seq;
            // A change on the target: its notices may be told again.
            m.shown.retain(|(_, t), _| *t != target);
            if let Some(s) = spawner {
                // Decision 0002: a named watcher without a cursor starts at 0.
                m.cursors.entry((s, target)).or_insert(Seqs::at(0));
            }
            for ((w, t), c) in &mut m.cursors {
                if *t == target {
                    c.material_event(seq);
                    // Decision 0002: every material event re-delivers its watcher's notice.
                    m.lost.remove(&(*w, *t));
                }
            }
        }
        Op::Spawn {
            watcher,
            target,
            run,
        } => {
            let event = world
                .svc
                .subagent_spawned(
                    &target_key(target),
                    None,
                    &watcher_key(watcher),
                    &format!("run-{run}"),
                )
                .await
                .ok_or_else(|| fail("the spawn was not recorded".into()))?;
            if let Some((t, seq)) = m.runs.get(&run) {
                // DESIGN 3: a dedupe key that exists returns the stored event, touching nothing.
                prop_assert_eq!(event.sequence.0, *seq, "a deduplicated spawn");
                prop_assert_eq!(event.session_key.as_str(), TARGETS[*t]);
                return Ok(());
            }
            let seq = event.sequence.0;
            m.heads[target] = seq;
            m.runs.insert(run, (target, seq));
            // DESIGN 4, seed: at the spawn's sequence, unless a notice is pending.
            let c = m.cursors.entry((watcher, target)).or_insert(Seqs::at(seq));
            if !c.pending() {
                *c = Seqs::at(seq);
            }
        }
        Op::Watch { watcher, target } => {
            let outcome = world
                .svc
                .watch_after_send(&watcher_key(watcher), &target_key(target), None, true)
                .await;
            prop_assert!(outcome.watched, "watch refused: {:?}", outcome);
            // DESIGN 4, explicit watch: at the head; watching again keeps the cursor.
            let head = m.heads[target];
            m.cursors.entry((watcher, target)).or_insert(Seqs::at(head));
        }
        Op::Unwatch { watcher, target } => {
            let existed = world
                .svc
                .try_unwatch(&watcher_key(watcher), &target_key(target))
                .await
                .map_err(|e| fail(format!("unwatch failed: {e}")))?;
            prop_assert_eq!(
                existed,
                m.cursors.remove(&(watcher, target)).is_some(),
                "unwatch answers whether a watch existed"
            );
            m.lost.remove(&(watcher, target));
            excuse(world, m, watcher, |t| t == target);
            // What a dropped turn took about the target need not be shown any more (nor is it
            // dropped: only a reset or a deletion of the watcher drops it).
            for took in &mut m.carried[watcher] {
                if took.target == target {
                    took.owed = false;
                }
            }
        }
        Op::Turn { watcher } => turn(world, m, watcher).await?,
        Op::DropTurn {
            watcher,
            polls,
            between,
        } => drop_turn(world, m, watcher, polls, between).await?,
        Op::PickUp => {
            let before: Vec<Vec<QueuedEntry>> = (0..WATCHERS.len())
                .map(|w| world.queue.peek(&watcher_key(w)))
                .collect();
            let picked = world.svc.pick_up().await;
            let mut gained = 0;
            for (w, before) in before.iter().enumerate() {
                let after = world.queue.peek(&watcher_key(w));
                let new = after.iter().filter(|e| !before.contains(e)).count();
                if !OWNED[w] {
                    // DESIGN 9.1: an adapter delivers only to the watchers it owns.
                    prop_assert_eq!(
                        &after,
                        before,
                        "a pick-up queued for {}, which this gateway does not own",
                        WATCHERS[w]
                    );
                }
                gained += new;
            }
            prop_assert_eq!(
                picked,
                PickUp {
                    queued: gained,
                    complete: true
                }
            );
            m.lost.retain(|(w, _)| !OWNED[*w]);
            // Decision 0003, stop 48: the next pick-up wakes a main session whose dropped turn
            // left it lines holding a notice that wakes, once; `Awareness::pick_up`: "It also
            // wakes, once, a main session ...", the directory's (DESIGN 9.1). A debt of a
            // watcher the gateway does not wake is gone too: one pick-up settles it.
            for (w, owed) in m.wake_owed.iter_mut().enumerate() {
                if std::mem::take(owed) {
                    m.owed_woken[w] = is_main(w) && OWNED[w];
                }
            }
        }
        Op::LoseLines { watcher } => {
            drop(world.svc.take_queued(&watcher_key(watcher)));
            m.excused[watcher].clear();
            let pending: Vec<usize> = m
                .of_watcher(watcher)
                .into_iter()
                .filter(|(_, c)| c.pending())
                .map(|(t, _)| t)
                .collect();
            for t in pending {
                m.lost.insert((watcher, t));
            }
        }
        Op::Reset { watcher } => {
            world.svc.on_reset(&watcher_key(watcher)).await;
            let left = world
                .store
                .cursors(&CursorFilter {
                    watcher: Some(watcher_key(watcher)),
                    ..CursorFilter::default()
                })
                .await
                .map_err(|e| fail(format!("cursors: {e}")))?;
            prop_assert!(
                left.is_empty(),
                "DESIGN 6: a reset deletes the cursors where the session is the watcher: {:?}",
                left
            );
            m.cursors.retain(|(w, _), _| *w != watcher);
            m.lost.retain(|(w, _)| *w != watcher);
            excuse(world, m, watcher, |_| true);
            m.reset_quiet[watcher] = true;
            // Decision 0003 (stop 37, 38): a reset drops the session-state notices a dropped
            // turn took before it began, and with them the wake they were owed (stop 48).
            m.carried[watcher].clear();
            m.wake_owed[watcher] = false;
        }
        Op::Delete { target } => {
            let r = SessionRef::parse(TARGETS[target], TARGET_AGENTS[target]).expect("ref");
            world.svc.on_delete(&r).await;
            // DESIGN 6: its events, head and the cursors where it is the target go.
            m.cursors.retain(|(_, t), _| *t != target);
            m.lost.retain(|(_, t)| *t != target);
            m.heads[target] = 0;
            m.runs.retain(|_, (t, _)| *t != target);
            for w in 0..WATCHERS.len() {
                excuse(world, m, w, |t| t == target);
                // The target is no watcher: what a dropped turn took about it stays (a deletion
                // drops what a dropped turn of the deleted session left), but is owed no more.
                for took in &mut m.carried[w] {
                    if took.target == target {
                        took.owed = false;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Marks the session-state lines queued for `watcher` about the targets `which` selects as
/// stale: their cursors are gone.
fn excuse(world: &World, m: &mut Model, watcher: usize, which: impl Fn(usize) -> bool) {
    for e in world.queue.peek(&watcher_key(watcher)) {
        if target_of(&e).is_some_and(&which) {
            m.excused[watcher].push(e);
        }
    }
}

/// A watcher's turn: what it returns, and the model's acknowledgement.
async fn turn(world: &World, m: &mut Model, watcher: usize) -> Result<(), TestCaseError> {
    let shown = world.svc.drain_turn(&watcher_key(watcher)).await;
    turn_shows(m, watcher, &shown)
}

/// A watcher's turn whose caller gives up after `polls` polls (a host's turn timeout): with
/// `between`, the tasks it spawned run after each poll, else only once it is dropped. A turn
/// that ends within its polls is a turn like any other. One dropped is modelled as having
/// shown nothing: with the in-memory store its first poll runs up to its acknowledgement,
/// which commits on a task of its own and queues its follow-ups, and what it settled on (the
/// lines a turn would have shown now) goes to the watcher's next turn (decision 0003, "a turn
/// whose caller gives up"; `drain_turn`'s docs).
async fn drop_turn(
    world: &World,
    m: &mut Model,
    watcher: usize,
    polls: u8,
    between: bool,
) -> Result<(), TestCaseError> {
    use std::task::Poll;
    settle().await;
    let key = watcher_key(watcher);
    let queued_before = world.queue.peek(&key);
    let wakes_before = world.wake.count(&key);
    let mut turn = Box::pin(world.svc.drain_turn(&key));
    let mut ended = None;
    for _ in 0..polls {
        let polled = std::future::poll_fn(|cx| Poll::Ready(turn.as_mut().poll(cx))).await;
        if let Poll::Ready(shown) = polled {
            ended = Some(shown);
            break;
        }
        if between {
            settle().await;
        }
    }
    drop(turn);
    settle().await;
    if let Some(shown) = ended {
        return turn_shows(m, watcher, &shown);
    }
    if polls == 0 {
        // Never polled: it took nothing, and wrote nothing.
        return Ok(());
    }
    for line in m.current_lines(watcher) {
        let target = target_of(&line).ok_or_else(|| fail(format!("not a notice: {line:?}")))?;
        if let Some(took) = m.carried[watcher].iter_mut().find(|c| c.line == line) {
            took.owed = true;
        } else {
            m.carried[watcher].push(Took {
                target,
                line,
                owed: true,
            });
        }
    }
    // Stop 48: the turn notes whether what it settled on holds a notice that wakes (every
    // watch here is explicit: none is an ambient one's, decision 0015).
    m.wake_owed[watcher] = !m.carried[watcher].is_empty();
    // Stop 53: its acknowledgement pays that wake as it lets the turn's lock go, when the turn
    // was dropped before the acknowledgement ended (else the next pick-up pays it); a session
    // this gateway does not wake is woken by neither. Whichever paid it, it is paid once.
    let gained = world
        .queue
        .peek(&key)
        .iter()
        .filter(|e| !queued_before.contains(e))
        .count();
    let woken = world.wake.count(&key) - wakes_before;
    let paid = woken
        .checked_sub(if is_main(watcher) { gained } else { 0 })
        .ok_or_else(|| fail(format!("{key} woken {woken} times for {gained} line(s)")))?;
    match paid {
        0 => {}
        1 if m.wake_owed[watcher] && is_main(watcher) && OWNED[watcher] => {
            m.wake_owed[watcher] = false;
            m.let_go_woken[watcher] = true;
        }
        _ => {
            return Err(fail(format!(
                "{key} woken {woken} times for {gained} line(s), owing {}",
                m.wake_owed[watcher]
            )));
        }
    }
    acknowledge_in_model(m, watcher);
    m.after_turn[watcher] = None;
    Ok(())
}

/// DESIGN 4, acknowledge: a turn (or a dropped one's acknowledgement, which commits) settles
/// every pending cursor of the watcher, and its queue was drained.
fn acknowledge_in_model(m: &mut Model, watcher: usize) {
    for ((w, _), c) in &mut m.cursors {
        if *w == watcher && c.pending() {
            c.acknowledge();
        }
    }
    m.lost.retain(|(w, _)| *w != watcher);
    m.excused[watcher].clear();
}

/// Checks what a turn of `watcher` showed, then acknowledges in the model.
fn turn_shows(m: &mut Model, watcher: usize, shown: &[QueuedEntry]) -> Result<(), TestCaseError> {
    let name = WATCHERS[watcher];
    let current = m.current_lines(watcher);
    let now = m.of_watcher(watcher);
    let carried = std::mem::take(&mut m.carried[watcher]);
    prop_assert!(
        shown.iter().all(QueuedEntry::is_session_state),
        "only session-state lines are ever queued here: {:?}",
        shown
    );
    let mut targets = BTreeSet::new();
    let mut fresh_targets = BTreeSet::new();
    let mut texts = BTreeSet::new();
    let mut fresh_seen = false;
    for e in shown {
        let t = target_of(e).ok_or_else(|| fail(format!("{name}: unknown context key: {e:?}")))?;
        targets.insert(t);
        prop_assert!(
            texts.insert(e.text.clone()),
            "notify once: {}'s turn shows one notice twice: {:?}",
            name,
            shown
        );
        if carried.iter().any(|c| c.line == *e) {
            prop_assert!(
                !fresh_seen,
                "decision 0003: the next turn returns what a dropped turn took first; {}'s turn \
                 shows {:?} after a line of its own: {:?} (taken {:?})",
                name,
                e,
                shown,
                carried
            );
        } else {
            fresh_seen = true;
            prop_assert!(
                fresh_targets.insert(t),
                "notify once: {}'s turn shows two lines for {}: {:?}",
                name,
                TARGETS[t],
                shown
            );
            prop_assert!(
                current.contains(e),
                "{}'s turn shows {:?}, neither the notice of a pending cursor nor a line a \
                 dropped turn took (decision 0003: stale lines are left out): {:?} (pending \
                 {:?}, taken {:?})",
                name,
                e,
                shown,
                current,
                carried
            );
        }
        // Across turns: the same notice is not told twice; only a change on the target makes
        // new ones (a follow-up has a text of its own).
        prop_assert!(
            m.shown
                .entry((watcher, t))
                .or_default()
                .insert(e.text.clone()),
            "notify once: {}'s turns show {:?} twice with no change on {} in between (this \
             turn: {:?})",
            name,
            e.text,
            TARGETS[t],
            shown
        );
    }
    for e in &current {
        prop_assert!(
            shown.contains(e),
            "decision 0003: a pending cursor always surfaces on the watcher's next turn; {}'s \
             turn leaves out {:?}: {:?}",
            name,
            e,
            shown
        );
    }
    for took in carried.iter().filter(|c| c.owed) {
        prop_assert!(
            shown.contains(&took.line),
            "decision 0003: what a dropped turn took goes to the watcher's next turn; {}'s turn \
             leaves out {:?}: {:?}",
            name,
            took.line,
            shown
        );
    }
    if m.reset_quiet[watcher] {
        prop_assert!(
            shown.is_empty(),
            "{} was reset and has no pending cursor since, yet its turn shows {:?}",
            name,
            shown
        );
    }
    if let Some(last) = &m.after_turn[watcher]
        && *last == now
    {
        // No change since its last turn: exactly that turn's follow-ups, and after a turn that
        // handed out none, nothing.
        let follow_ups: BTreeSet<usize> = last
            .iter()
            .filter(|(_, c)| c.pending())
            .map(|(t, _)| *t)
            .collect();
        prop_assert_eq!(
            &targets,
            &follow_ups,
            "{}'s turn after a turn with no change in between",
            name
        );
    }
    acknowledge_in_model(m, watcher);
    // Stop 48: a turn takes what a dropped one left, and the wake it was owed.
    m.wake_owed[watcher] = false;
    m.after_turn[watcher] = Some(m.of_watcher(watcher));
    Ok(())
}

/// The invariants that hold after every step.
async fn check(
    world: &World,
    m: &Model,
    op: Op,
    queues_before: &[Vec<QueuedEntry>],
    wakes_before: &[usize],
) -> Result<(), TestCaseError> {
    // The store's cursors are what DESIGN 4's rules make of the operations.
    let stored = world
        .store
        .cursors(&CursorFilter::default())
        .await
        .map_err(|e| fail(format!("cursors: {e}")))?;
    let mut actual = BTreeMap::new();
    for c in &stored {
        let w = WATCHERS
            .iter()
            .position(|w| *w == c.watcher.as_str())
            .ok_or_else(|| fail(format!("a cursor of an unknown watcher: {c:?}")))?;
        let t = TARGETS
            .iter()
            .position(|t| *t == c.target.as_str())
            .ok_or_else(|| fail(format!("a cursor on an unknown target: {c:?}")))?;
        prop_assert_eq!(c.target_agent.as_str(), TARGET_AGENTS[t]);
        actual.insert(
            (w, t),
            Seqs {
                last_seen: c.last_seen.0,
                notified: c.notified.0,
                material: c.material.0,
            },
        );
    }
    prop_assert_eq!(&actual, &m.cursors, "the store's cursors after {:?}", op);

    for w in 0..WATCHERS.len() {
        let name = WATCHERS[w];
        let queued = world.queue.peek(&watcher_key(w));
        let current = m.current_lines(w);
        // Notify once, in the queue: every line is a current notice, or stale because its
        // cursor went.
        let mut live = BTreeSet::new();
        for e in &queued {
            prop_assert!(e.is_session_state(), "{}: {:?}", name, e);
            let t =
                target_of(e).ok_or_else(|| fail(format!("{name}: unknown context key: {e:?}")))?;
            if current.contains(e) {
                prop_assert!(
                    live.insert(t),
                    "notify once: {}'s queue holds two lines for {}: {:?}",
                    name,
                    TARGETS[t],
                    queued
                );
            } else {
                prop_assert!(
                    m.excused[w].contains(e),
                    "{}'s queue holds a line that is no current notice, though its cursor is \
                     still there: {:?} (queue {:?}, cursors {:?})",
                    name,
                    e,
                    queued,
                    m.of_watcher(w)
                );
            }
        }
        // Nothing lost: every pending cursor's line is queued, unless a lost line took it and
        // nothing delivered it again since.
        for (t, c) in m.of_watcher(w) {
            if c.pending() && !m.lost.contains(&(w, t)) {
                prop_assert!(
                    queued.contains(&line(t, c.last_seen)),
                    "nothing lost: {}'s pending cursor on {} ({:?}) has no line in its queue {:?}",
                    name,
                    TARGETS[t],
                    c,
                    queued
                );
            }
        }
        // Wakes: one per line gained by a main session, and one for what its dropped turn
        // left it at the pick-up that owes it, unless that pick-up woke it for lines it
        // queued (the same turn shows both); none for a nested subagent.
        let gained = queued
            .iter()
            .filter(|e| !queues_before[w].contains(e))
            .count();
        let owed = usize::from(m.owed_woken[w] && gained == 0) + usize::from(m.let_go_woken[w]);
        let woken = world.wake.count(&watcher_key(w)) - wakes_before[w];
        let want = if is_main(w) { gained + owed } else { 0 };
        prop_assert_eq!(
            woken,
            want,
            "{} woken {} times, its queue gained {} line(s) and {} wake(s) for what a dropped \
             turn left were owed: {:?} -> {:?}",
            name,
            woken,
            gained,
            owed,
            &queues_before[w],
            queued
        );
    }
    Ok(())
}

async fn run_case(ops: &[Op]) -> Result<(), TestCaseError> {
    let world = world();
    let mut m = Model::default();
    for &op in ops {
        let queues_before: Vec<Vec<QueuedEntry>> = (0..WATCHERS.len())
            .map(|w| world.queue.peek(&watcher_key(w)))
            .collect();
        let wakes_before: Vec<usize> = (0..WATCHERS.len())
            .map(|w| world.wake.count(&watcher_key(w)))
            .collect();
        m.owed_woken = [false; 3];
        m.let_go_woken = [false; 3];
        apply(&world, &mut m, op).await?;
        for w in 0..WATCHERS.len() {
            if m.of_watcher(w).values().any(|c| c.pending()) {
                m.reset_quiet[w] = false;
            }
        }
        check(&world, &m, op, &queues_before, &wakes_before).await?;
    }
    Ok(())
}

#[test]
fn delivery_keeps_the_design_promises() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (mut runner, again) = awareness_core::testkit::model::seeded_runner();
    let result = runner.run(&proptest::collection::vec(op_strategy(), 1..=40), |ops| {
        rt.block_on(run_case(&ops))
    });
    if let Err(e) = result {
        panic!("delivery model failed: {e}\n({again})");
    }
}

/// Cases runs of the model have found, made at every run (a seed drawn at random need not
/// reach them again): a pick-up that queued a line for a session owed a wake for its dropped
/// turn's lines, which the model expected woken twice and the service woke once (the turn the
/// wake brings shows both).
#[test]
fn cases_found_before_still_keep_the_promises() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    for between in [false, true] {
        let dropped = Op::DropTurn {
            watcher: 0,
            polls: 1,
            between,
        };
        let cases = [
            vec![
                Op::Human { target: 0 },
                Op::Human { target: 0 },
                dropped,
                Op::LoseLines { watcher: 0 },
                Op::PickUp,
            ],
            vec![
                Op::Human { target: 0 },
                dropped,
                Op::Human { target: 0 },
                Op::LoseLines { watcher: 0 },
                Op::PickUp,
            ],
        ];
        for case in cases {
            rt.block_on(run_case(&case))
                .unwrap_or_else(|e| panic!("{case:?}: {e}"));
        }
    }
}
