//! What a read-write open does with a path that holds no store yet, or no usable one, checked
//! the same way on every durable store: a directory, a missing directory, a file that is not a
//! store and a truncated store are refused with a [`StoreError::Open`] naming the path, and
//! leave everything as it was (nothing created, nothing written); an empty file becomes a new
//! store; two opens of a new path at once both succeed and share one store; an open
//! cancelled at any moment leaves nothing but the store's own files, and a path that opens;
//! (on Unix) the files a new store creates are private to their owner (mode 0600); and (on
//! Unix) an open by a user who may not write the directory or the store's file, or read the
//! file, gives a [`StoreError::Open`] naming the file where it cannot work, never a store that
//! fails on its first write. Those three open as another user (`nobody`, when the tests run as root) in a
//! process of their own: the test binary, started again to run just that test, which then
//! opens the path it is given and reports instead of running the check ([`ThisTest`]); they
//! are stamped apart, in a test target of their own ([`crate::permission_suite!`]).
//! store-memory has no file and does not run these.
//!
//! A store provides an async factory that opens the file it is given read-write with its
//! default options (creating it when missing) and stamps the checks with
//! [`crate::open_suite!`]:
//!
//! ```text
//! async fn open(path: std::path::PathBuf)
//!     -> Result<awareness_core::testkit::Subject, awareness_core::StoreError>
//! { /* open the store on that file */ }
//! awareness_core::open_suite!(open);
//! ```

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use super::checks::{T0, child, human, log_only, r, rec};
use super::durable::open;
use super::{OpenFile, Scratch, poll_once};
use crate::error::{OpenFailure, StoreError};
use crate::model::Sequence;
use crate::store::AwarenessStoreExt as _;

/// Every entry of `dir`, by name: a file's bytes, or `None` for a directory (and its entries,
/// by their path under `dir`).
pub(crate) fn contents(dir: &Path) -> BTreeMap<OsString, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("list the directory") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().expect("a name").to_owned();
        if path.is_dir() {
            for (inner, bytes) in contents(&path) {
                let mut nested = name.clone();
                nested.push("/");
                nested.push(inner);
                out.insert(nested, bytes);
            }
            out.insert(name, None);
        } else {
            out.insert(name, Some(std::fs::read(&path).expect("read a file")));
        }
    }
    out
}

/// Opens `path` read-write through `f` and asserts that the open is refused with a
/// [`StoreError::Open`] of kind `expected` naming `path`, with a reason, in a message that
/// names it too and does not quote its source (a reporter that prints every source after the
/// message, as anyhow's `{:#}` does, printed the cause twice); and that everything in `dir` is
/// byte for byte as it was before.
async fn assert_refused(
    what: &str,
    f: &impl OpenFile,
    path: &Path,
    dir: &Scratch,
    expected: OpenFailure,
) {
    let before = contents(dir.path());
    let Err(err) = f(path.to_path_buf()).await else {
        panic!("{what}: the open succeeded");
    };
    match &err {
        StoreError::Open {
            path: named,
            reason,
            kind,
            ..
        } => {
            assert_eq!(named, path, "{what}: the refusal names the path");
            assert!(!reason.is_empty(), "{what}: the refusal gives a reason");
            assert_eq!(*kind, expected, "{what}: {reason}");
        }
        other => panic!("{what}: expected StoreError::Open, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&path.display().to_string()),
        "{what}: the message names the path: {text}"
    );
    assert_source_not_quoted(what, &err);
    let after = contents(dir.path());
    assert!(
        after == before,
        "{what}: a refused open created, removed or wrote nothing: before {:?}, after {:?}",
        sizes(&before),
        sizes(&after)
    );
}

/// Asserts that `err`'s message quotes none of its sources, however deep, nor any part of one
/// (a library's error often shows the io error it wraps, `I/O error: Not a redb database: ...`,
/// without giving it as its own source, so a reason that quoted the io error quotes a part of
/// the source): a reporter that prints every source after the message (anyhow's `{:#}`)
/// would print that cause twice. (The workspace's [`crate::error::ErrorChain`] skips a source
/// already shown whole, so it hides that.) A part is what a source's text holds between its
/// `: ` separators, of 8 bytes or more. `what` names the case in the failure.
#[track_caller]
pub fn assert_source_not_quoted(what: &str, err: &(dyn std::error::Error + 'static)) {
    let text = err.to_string();
    for source in std::iter::successors(err.source(), |e| e.source()) {
        let cause = source.to_string();
        for part in cause.split(": ").map(str::trim).filter(|p| p.len() >= 8) {
            assert!(
                !text.contains(part),
                "{what}: the message quotes {part:?} of its source {cause:?}, which a reporter prints after it again: {text}"
            );
        }
    }
}

/// The names and sizes of [`contents`] (`None` for a directory), for a message.
pub(crate) fn sizes(
    contents: &BTreeMap<OsString, Option<Vec<u8>>>,
) -> Vec<(&OsString, Option<usize>)> {
    contents
        .iter()
        .map(|(name, bytes)| (name, bytes.as_ref().map(Vec::len)))
        .collect()
}

/// A directory where the file should be is refused, and left as it was (with what it holds).
pub async fn a_directory_is_refused(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let file = dir.file();
    std::fs::create_dir(&file).expect("a directory at the store's path");
    std::fs::write(file.join("inside"), b"somebody's file").expect("a file in it");
    assert_refused("a directory", &f, &file, &dir, OpenFailure::NotAStore).await;
}

/// A file in a directory that does not exist is refused, and the directory is not created.
pub async fn a_missing_directory_is_not_created(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let missing = dir.path().join("missing");
    let file = missing.join("state");
    assert_refused(
        "a file in a missing directory",
        &f,
        &file,
        &dir,
        OpenFailure::NotFound,
    )
    .await;
    assert!(!missing.exists(), "the missing directory was not created");
}

/// A file that is not a store (text, long enough to look like a header and to span pages) is
/// refused and left byte for byte as it was, with nothing created beside it.
pub async fn a_file_that_is_not_a_store_is_refused_and_left_untouched(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let file = dir.file();
    let text = "these are somebody's notes, not a database\n".repeat(2_000);
    std::fs::write(&file, &text).expect("a text file");
    assert_refused("a text file", &f, &file, &dir, OpenFailure::NotAStore).await;
}

/// A store's file cut to half its length (a copy that stopped midway, a full disk) is refused
/// and left byte for byte as it was, with nothing created beside it: an open must neither
/// repair it nor start a new store over it. On Unix, the same through a symbolic link in
/// another directory (as a deployment may point a configured path at a volume): whatever a
/// store makes beside its file while opening it is made beside the file the link names, and
/// both directories must be left as they were.
pub async fn a_truncated_file_is_refused_and_left_untouched(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let file = dir.file();
    let t = open(&f, &file).await;
    let summary = "x".repeat(150);
    for i in 0..500 {
        let session = r(&format!("agent:main:subagent:s{}", i % 10), "main");
        rec(&*t.store, log_only(&session, &summary), T0).await;
    }
    t.close().await;
    let len = std::fs::metadata(&file).expect("metadata").len();
    assert!(len >= 64 * 1024, "the store spans many pages: {len} bytes");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .and_then(|file| file.set_len(len / 2))
        .expect("truncate the file");
    assert_refused("a truncated store", &f, &file, &dir, OpenFailure::Other).await;
    #[cfg(unix)]
    {
        let links = Scratch::new("open-link");
        let link = links.path().join("state-link");
        std::os::unix::fs::symlink(&file, &link).expect("a symbolic link to the store");
        let beside_the_file = contents(dir.path());
        assert_refused(
            "a truncated store behind a link",
            &f,
            &link,
            &links,
            OpenFailure::Other,
        )
        .await;
        assert!(
            contents(dir.path()) == beside_the_file,
            "a refused open through a link changed nothing beside the file it names"
        );
    }
}

/// An empty file (created beforehand, as a deployment tool may) is opened as a new store: it
/// records from sequence 1, and what it recorded is there after a reopen.
pub async fn an_empty_file_becomes_a_new_store(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let file = dir.file();
    std::fs::write(&file, b"").expect("an empty file");
    let kid = child();
    let t = open(&f, &file).await;
    assert_eq!(
        t.store.log_stats().await.expect("stats").rows,
        0,
        "an empty file holds no events"
    );
    let first = rec(&*t.store, human(&kid), T0).await;
    assert_eq!(first.event.sequence, Sequence(1), "a new store starts at 1");
    t.close().await;
    assert!(
        std::fs::metadata(&file).expect("metadata").len() > 0,
        "the store was written into the empty file"
    );
    let t = open(&f, &file).await;
    assert_eq!(
        t.store.state_version(&kid).await.expect("version"),
        Sequence(1),
        "the new store's event is there after a reopen"
    );
    let next = rec(&*t.store, human(&kid), T0).await;
    assert_eq!(next.event.sequence, Sequence(2));
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    // Names only, no bytes: a file a background task removes (a cancelled open's staged copy,
    // a companion file at close) may go between the listing and a read, which then failed the
    // check while the directory was still settling.
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("list the directory") {
            let path = entry.expect("a directory entry").path();
            let name = format!(
                "{prefix}{}",
                path.file_name().expect("a name").to_string_lossy()
            );
            if path.is_dir() {
                walk(&path, &format!("{name}/"), out);
            }
            out.push(name);
        }
    }
    let mut names = Vec::new();
    walk(dir, "", &mut names);
    names.sort();
    names
}

/// Asserts that `dir` holds the store's file `state` and nothing else (no staged copy, no
/// companion file left after every handle closed).
fn assert_only_the_store(what: &str, dir: &Scratch) {
    let left = names(dir.path());
    assert_eq!(left, ["state"], "{what}: only the store's file is left");
}

/// The names in `dir` once `done` holds for them, or after 30 s: a cancelled open may leave
/// work that ends on a thread of its own (a connection closing, a file being made), and what it
/// leaves is checked once it has ended. (A hang guard, not a timing assertion: the caller
/// asserts on the names.)
async fn settled_names(dir: &Path, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let names = names(dir);
        if done(&names) || Instant::now() >= deadline {
            return names;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Two opens of the same new path at once (two tasks of a gateway starting together) both
/// succeed and share one store: what one records, the other reads, and it is in the file once
/// both are closed, with nothing but the store's file left beside it. A store that creates a
/// new file must not let the second open fail on, or remove, what the first is making. Every
/// other round the path holds an empty file (as a deployment tool may create), which both opens
/// make a store at once. The two opens start together on two threads, behind a barrier, so
/// that they overlap on both cores (awaited on one task, they overlapped in few rounds).
pub async fn two_opens_of_a_new_file_at_once_both_succeed_and_share_it(f: impl OpenFile + Sync) {
    let kid = child();
    for round in 0..100 {
        let dir = Scratch::new("open");
        let file = dir.file();
        if round % 2 == 1 {
            std::fs::write(&file, b"").expect("an empty file");
        }
        let (a, b) = open_twice_at_once(&f, &file);
        let a = a.unwrap_or_else(|e| panic!("round {round}: the first open failed: {e}"));
        let b = b.unwrap_or_else(|e| panic!("round {round}: the second open failed: {e}"));
        // Record through each handle in turn, and read through the other.
        let (first, second) = if round % 2 == 0 { (a, b) } else { (b, a) };
        let recorded = rec(&*first.store, human(&kid), T0).await;
        assert_eq!(
            recorded.event.sequence,
            Sequence(1),
            "round {round}: one new store, starting at 1"
        );
        assert_eq!(
            second.store.state_version(&kid).await.expect("version"),
            Sequence(1),
            "round {round}: the other handle reads the same store"
        );
        let next = rec(&*second.store, human(&kid), T0).await;
        assert_eq!(next.event.sequence, Sequence(2), "round {round}");
        first.close().await;
        second.close().await;
        let t = open(&f, &file).await;
        assert_eq!(
            t.store.state_version(&kid).await.expect("version"),
            Sequence(2),
            "round {round}: both handles' events are in the file"
        );
        t.close().await;
        assert_only_the_store(&format!("round {round}"), &dir);
    }
}

/// Opens `file` through `f` on two threads released together by a barrier, each driving its
/// open on the current (multi-thread) runtime.
fn open_twice_at_once(
    f: &(impl OpenFile + Sync),
    file: &Path,
) -> (
    Result<super::Subject, StoreError>,
    Result<super::Subject, StoreError>,
) {
    let runtime = tokio::runtime::Handle::current();
    let start = std::sync::Barrier::new(2);
    let one = || {
        start.wait();
        runtime.block_on(f(file.to_path_buf()))
    };
    tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            let a = s.spawn(one);
            let b = s.spawn(one);
            (
                a.join().expect("the first open's thread"),
                b.join().expect("the second open's thread"),
            )
        })
    })
}

/// An open of a new path cancelled at any moment (a caller's timeout, a gateway shutting down
/// while it starts) leaves the directory with nothing but the store's own files, and the path
/// opens afterwards as a new, empty store: no staged copy is left, no half-made file refuses
/// the next open, and work the cancelled open left running does not hold the file against it.
pub async fn an_open_cancelled_at_any_moment_leaves_a_path_that_opens(f: impl OpenFile) {
    let kid = child();
    let mut cancelled = 0;
    for round in 0..150u64 {
        let dir = Scratch::new("open");
        let file = dir.file();
        // Polled until `budget` has passed, then dropped: from cancelled after its first poll
        // to after it finished.
        let budget = Duration::from_micros(round % 75 * 40);
        let started = Instant::now();
        {
            let mut opening = std::pin::pin!(f(file.clone()));
            while !poll_once(opening.as_mut()).await {
                if started.elapsed() >= budget {
                    // Dropped while it was under way.
                    cancelled += 1;
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        let the_stores = |names: &[String]| names.iter().all(|n| n.starts_with("state"));
        let left = settled_names(dir.path(), the_stores).await;
        assert!(
            the_stores(&left),
            "round {round}: the cancelled open left {left:?}"
        );
        let t = f(file.clone())
            .await
            .unwrap_or_else(|e| panic!("round {round}: the open after a cancelled one: {e}"));
        assert_eq!(
            t.store.log_stats().await.expect("stats").rows,
            0,
            "round {round}: a new store holds no events"
        );
        let first = rec(&*t.store, human(&kid), T0).await;
        assert_eq!(first.event.sequence, Sequence(1), "round {round}");
        t.close().await;
        let left = settled_names(dir.path(), |names| names == ["state"]).await;
        assert_eq!(
            left,
            ["state"],
            "round {round}: only the store's file is left"
        );
    }
    // Otherwise the rounds checked only complete opens.
    assert!(cancelled > 0, "no open was cancelled while under way");
}

/// The files a store creates for a new path (its file, and any it keeps beside it, such as a
/// write-ahead log) are private to their owner, mode 0600 whatever the process's umask lets
/// through: a store holds what people typed. Checked while the store is open and has
/// recorded, so that files made for writing are there, and again once it is closed. (Under a
/// umask that already hides every bit of the group and others, as 077 does, a store that left
/// the mode to the umask would pass too; tests usually run under 022.)
#[cfg(unix)]
pub async fn new_files_are_private_to_their_owner(f: impl OpenFile) {
    let dir = Scratch::new("open");
    let t = open(&f, &dir.file()).await;
    rec(&*t.store, human(&child()), T0).await;
    assert_private("while the store is open", &dir);
    t.close().await;
    assert_private("once the store is closed", &dir);
}

/// Asserts that `dir` holds the store's file `state` and that every file in it has mode 0600;
/// `when` says when, in messages.
#[cfg(unix)]
fn assert_private(when: &str, dir: &Scratch) {
    use std::os::unix::fs::PermissionsExt as _;
    let names = names(dir.path());
    assert!(
        names.iter().any(|n| n == "state"),
        "{when}: the store's file: {names:?}"
    );
    for name in names {
        let path = dir.path().join(&name);
        // A companion file may go between the listing and this look (a log removed at close).
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_file() {
            let mode = meta.permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{when}: {name} has mode {mode:o}, not 600");
        }
    }
}

/// Held by each check of [`crate::permission_suite!`] for its whole run, so that the checks of
/// one test binary run one at a time: none forks while another has a file open (a copy of the
/// test binary being written, a store and its lock), which its child would hold until it execs.
#[cfg(unix)]
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The name the test harness knows a stamped test by (its module path in the test crate, then
/// its name), for a check that starts the same test binary again: see
/// [`a_directory_without_write_permission_gives_a_clear_error`].
#[derive(Debug, Clone, Copy)]
pub struct ThisTest {
    module: &'static str,
    name: &'static str,
}

impl ThisTest {
    /// The test `name` stamped in the module `module_path` (`module_path!()` where it is
    /// stamped: the test crate's name comes first, which the harness leaves out).
    #[must_use]
    pub fn new(module_path: &'static str, name: &'static str) -> Self {
        let module = module_path.split_once("::").map_or("", |(_, rest)| rest);
        Self { module, name }
    }

    /// The name to give the harness with `--exact`.
    #[cfg(unix)]
    fn harness_name(&self) -> String {
        if self.module.is_empty() {
            self.name.to_owned()
        } else {
            format!("{}::{}", self.module, self.name)
        }
    }
}

/// Set on a test binary started by [`as_another_user`]: the path its check opens (and reports
/// on) instead of running.
#[cfg(unix)]
const OPEN_THIS: &str = "AWARENESS_TESTKIT_OPEN_AS_ANOTHER_USER";

/// The line before the report of a test binary started by [`as_another_user`].
#[cfg(unix)]
const REPORT: &str = "awareness-testkit-open-report: ";

/// The user a root process opens as (`nobody`): root ignores file and directory permissions.
#[cfg(unix)]
const NOBODY: u32 = 65_534;

/// What an open, in a process of its own, answered.
#[cfg(unix)]
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Attempt {
    /// The open failed.
    Refused {
        /// The path a [`StoreError::Open`] named (`None`: another error).
        open_error_path: Option<std::path::PathBuf>,
        /// Its kind ([`OpenFailure`]'s text).
        open_error_kind: Option<String>,
        /// The error's message.
        message: String,
        /// The error, in debug form.
        debug: String,
    },
    /// The open succeeded; then a recording answered its sequence, or failed.
    Opened { first_write: Result<u64, String> },
}

/// Opens `path` through `f` and, when that succeeds, records an event through it and closes it.
#[cfg(unix)]
async fn attempt(f: &impl OpenFile, path: std::path::PathBuf) -> Attempt {
    match f(path).await {
        Err(e) => Attempt::Refused {
            open_error_path: match &e {
                StoreError::Open { path, .. } => Some(path.clone()),
                _ => None,
            },
            open_error_kind: e.open_failure().map(|k| k.to_string()),
            message: e.to_string(),
            debug: format!("{e:?}"),
        },
        Ok(t) => {
            let first_write = t
                .store
                .record(human(&child()), T0)
                .await
                .map(|rec| rec.event.sequence.get())
                .map_err(|e| format!("{e:?}"));
            t.close().await;
            Attempt::Opened { first_write }
        }
    }
}

/// In a test binary started by [`as_another_user`]: makes the attempt it asks for, prints the
/// report, and answers `true` (the check is done). Elsewhere, `false`.
#[cfg(unix)]
async fn attempt_when_asked(f: &impl OpenFile) -> bool {
    let Some(path) = std::env::var_os(OPEN_THIS) else {
        return false;
    };
    let report = attempt(f, path.into()).await;
    println!(
        "{REPORT}{}",
        serde_json::to_string(&report).expect("a report as JSON")
    );
    true
}

/// Whether this process runs as root: the owner of a file it has just made in `dir`.
#[cfg(unix)]
fn is_root(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let probe = dir.join("owner");
    std::fs::write(&probe, b"").expect("a file to learn who owns it");
    let uid = std::fs::metadata(&probe).expect("its metadata").uid();
    std::fs::remove_file(&probe).expect("remove it");
    uid == 0
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

/// How long a process a check starts (this test binary, started again to make one open) may
/// run before the check calls it hung, kills it and fails: a hang guard, not a timing
/// assertion (such a process ends within a second or two).
pub const CHILD_DEADLINE: Duration = Duration::from_mins(1);

/// Runs `cmd` to its end with its stdout and stderr captured, as [`std::process::Command::output`]
/// does, for at most [`CHILD_DEADLINE`]: a process still running then is killed, and the test
/// fails naming `what` it was, with what it had printed, instead of waiting for ever. The
/// start is retried a few times while the program's file is busy (`ETXTBSY`: a copy of it
/// just written, whose descriptor a process another thread forked holds until it execs).
/// Blocking: from async code, call it in [`tokio::task::block_in_place`].
#[track_caller]
pub fn output_within(cmd: &mut std::process::Command, what: &str) -> std::process::Output {
    use std::process::Stdio;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut tries = 0;
    let child = loop {
        match cmd.spawn() {
            Ok(child) => break child,
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 20 => {
                tries += 1;
                // The fork that holds the file execs (and drops it) within moments.
                std::thread::sleep(Duration::from_millis(10 * tries));
            }
            Err(e) => panic!("{what}: could not be started: {e}"),
        }
    };
    wait_within(child, what)
}

/// Waits for `child` (its stdout and stderr piped, or not captured) as
/// [`std::process::Child::wait_with_output`] does, for at most [`CHILD_DEADLINE`]: still
/// running then, it is killed and the test fails naming `what` it was, with what it had
/// printed. Blocking, as [`output_within`].
#[track_caller]
pub fn wait_within(mut child: std::process::Child, what: &str) -> std::process::Output {
    let (stdout, out_thread) = drain(child.stdout.take());
    let (stderr, err_thread) = drain(child.stderr.take());
    let Some(status) = exit_within(&mut child) else {
        panic!(
            "{what}: still running after {CHILD_DEADLINE:?}, killed (it hung). \
             Its stdout:\n{}\nIts stderr:\n{}",
            String::from_utf8_lossy(&taken(&stdout)),
            String::from_utf8_lossy(&taken(&stderr))
        );
    };
    // It has exited: its pipes end (it starts no process that could hold them).
    for thread in [out_thread, err_thread].into_iter().flatten() {
        thread.join().expect("a reader of the child's output");
    }
    std::process::Output {
        status,
        stdout: taken(&stdout),
        stderr: taken(&stderr),
    }
}

/// The exit status of `child` once it exits, within [`CHILD_DEADLINE`]; `None` when it was
/// still running then, and has been killed and reaped (its caller fails the test, saying what
/// hung). A hang guard, not a timing assertion.
pub fn exit_within(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + CHILD_DEADLINE;
    loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        // A poll of the exit status, bounded by the deadline above.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The environment variable that seeds [`KillMoments`], to draw the delays of a failed run
/// again.
pub const KILL_SEED_VAR: &str = "AWARENESS_KILL_SEED";

/// The random delays a reliability test waits before it kills a child: a small PRNG
/// (xorshift64*) seeded from [`KILL_SEED_VAR`] when it is set, and from the clock otherwise,
/// so that each run kills at other moments and a failed run's delays can be drawn again. The
/// seed is printed when the PRNG is made (the test harness shows it with a failing test's
/// output). A kill's effect still depends on how far the child got by then, which no seed
/// repeats: the seed makes a failure likelier to come again, not certain.
#[derive(Debug)]
pub struct KillMoments(u64);

impl KillMoments {
    /// A PRNG for the test `test` (named in the printed line), seeded as the type says.
    pub fn new(test: &str) -> Self {
        let seed = match std::env::var(KILL_SEED_VAR) {
            Ok(s) => s
                .trim()
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{KILL_SEED_VAR}={s:?} is not a u64: {e}")),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| {
                    // The nanoseconds fill the low bits, which vary most between runs.
                    u64::try_from(d.as_nanos() & u128::from(u64::MAX)).unwrap_or(1)
                }),
        };
        println!("{test}: kill delays seeded with {KILL_SEED_VAR}={seed}");
        // xorshift never leaves 0: any other state works.
        Self(seed.max(1))
    }

    /// A number below `n` (`n` at least 1).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "KillMoments::below(0)");
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }

    /// A delay of up to `max` (below it, to the microsecond).
    pub fn delay_below(&mut self, max: Duration) -> Duration {
        let us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
        Duration::from_micros(self.below(us))
    }
}

/// What [`drain`] reads into, and the thread that reads it.
type Drained = (
    std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    Option<std::thread::JoinHandle<()>>,
);

/// Reads `pipe` (when there is one) to its end on a thread of its own (a child that fills a
/// pipe nobody reads never ends), into a buffer a report can read while that thread still
/// waits on the pipe.
fn drain(pipe: Option<impl std::io::Read + Send + 'static>) -> Drained {
    let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let thread = pipe.map(|mut pipe| {
        let buf = std::sync::Arc::clone(&buf);
        std::thread::spawn(move || {
            let mut chunk = [0_u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                buf.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend_from_slice(&chunk[..n]);
            }
        })
    });
    (buf, thread)
}

/// What [`drain`] has read so far, taken out of its buffer.
fn taken(buf: &std::sync::Mutex<Vec<u8>>) -> Vec<u8> {
    std::mem::take(
        &mut *buf
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// This test binary at a path the user an open runs as may start: as this user
/// (`as_nobody` false), the binary where it is; as `nobody`, the same when `nobody` may reach
/// it (every directory above it searchable by others, itself executable by them), and
/// otherwise a hard link to it in `dir/bin` (`dir` being a directory `nobody` may enter), or a
/// copy where a link cannot be made (`dir` on another file system than the build). A copy is
/// slow and, just written, may be refused for a moment (`ETXTBSY`), which [`output_within`]
/// retries; a link (or no link) avoids both. (A directory of its own beside the binary would
/// take a link, but `nobody` may reach it exactly when it may reach the binary itself.)
#[cfg(unix)]
pub fn test_binary_for(dir: &Path, as_nobody: bool) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    if !as_nobody || nobody_may_run(&exe) {
        return exe;
    }
    let bin = dir.join("bin");
    let placed = bin.join("test");
    if !placed.exists() {
        std::fs::create_dir_all(&bin).expect("a directory for the test binary");
        set_mode(&bin, 0o755);
        if std::fs::hard_link(&exe, &placed).is_err() {
            std::fs::copy(&exe, &placed).expect("copy the test binary");
        }
        set_mode(&placed, 0o755);
    }
    placed
}

/// Whether `nobody` may start `exe`: it, and every directory above it, grant it execute
/// (search) permission through the bits that apply to it (owner, group or others).
#[cfg(unix)]
fn nobody_may_run(exe: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let may_execute = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| {
            let bits = if m.uid() == NOBODY {
                m.mode() >> 6
            } else if m.gid() == NOBODY {
                m.mode() >> 3
            } else {
                m.mode()
            };
            bits & 0o1 != 0
        })
    };
    exe.is_absolute() && exe.ancestors().all(may_execute)
}

/// Opens `path` in a process of its own, as `nobody` when this process runs as root (which
/// ignores permissions) and as this user otherwise: this test binary, started again to run
/// `test` alone, which opens `path` through its factory instead of running its check
/// ([`attempt_when_asked`]), from `dir`, which `nobody` may enter ([`test_binary_for`]).
#[cfg(unix)]
fn as_another_user(test: ThisTest, dir: &Path, path: &Path) -> Attempt {
    use std::os::unix::process::CommandExt as _;
    let as_nobody = is_root(dir);
    let mut cmd = std::process::Command::new(test_binary_for(dir, as_nobody));
    cmd.args([
        test.harness_name().as_str(),
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(OPEN_THIS, path)
    .current_dir(dir);
    if as_nobody {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    let what = format!(
        "the test binary started as another user to open {}",
        path.display()
    );
    let out = tokio::task::block_in_place(|| output_within(&mut cmd, &what));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // After the harness's `test <name> ... ` on the same line.
    let Some(report) = stdout
        .lines()
        .find_map(|line| line.split_once(REPORT).map(|(_, report)| report))
    else {
        panic!(
            "the test binary started as another user to open {} reported nothing ({}):\n{stdout}\n{}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    };
    serde_json::from_str(report).expect("a report")
}

/// Asserts that `attempt`, an open of `path`, was refused with a [`StoreError::Open`] naming
/// it, of kind [`OpenFailure::PermissionDenied`], in a message that names it too.
#[cfg(unix)]
fn assert_refused_naming(what: &str, attempt: &Attempt, path: &Path) {
    match attempt {
        Attempt::Refused {
            open_error_path,
            open_error_kind,
            message,
            debug,
        } => {
            assert_eq!(
                open_error_path.as_deref(),
                Some(path),
                "{what}: a StoreError::Open naming the file, got {debug}"
            );
            assert_eq!(
                open_error_kind.as_deref(),
                Some(OpenFailure::PermissionDenied.to_string().as_str()),
                "{what}: {message}"
            );
            assert!(
                message.contains(&path.display().to_string()),
                "{what}: the message names the file: {message}"
            );
        }
        Attempt::Opened { first_write } => panic!(
            "{what}: the open succeeded, where it must be refused naming the file (its first \
             write then answered {first_write:?})"
        ),
    }
}

/// Checks that `dir` holds what it held `before` ([`contents`]) a refused open.
#[cfg(unix)]
fn unchanged_by_a_refused_open(dir: &Path, before: &BTreeMap<OsString, Option<Vec<u8>>>) {
    let after = contents(dir);
    assert!(
        after == *before,
        "a refused open changed the directory: before {:?}, after {:?}",
        sizes(before),
        sizes(&after)
    );
}

/// A scratch directory another user may enter, a directory `name` in it, and a store in that
/// (`existing`) holding one event on [`child`], closed.
#[cfg(unix)]
async fn a_store_of_one_event(
    f: &impl OpenFile,
    name: &str,
) -> (Scratch, std::path::PathBuf, std::path::PathBuf) {
    let outer = Scratch::new("open");
    set_mode(outer.path(), 0o755);
    let dir = outer.path().join(name);
    std::fs::create_dir(&dir).expect("the store's directory");
    let existing = dir.join("existing");
    let t = open(f, &existing).await;
    rec(&*t.store, human(&child()), T0).await;
    t.close().await;
    (outer, dir, existing)
}

/// An open by a user who may not write in the store's directory (mode 0555; as root, the
/// opener is `nobody`, in a process of its own, and the existing store is its file) gives a
/// clear error where it cannot work, never a store that fails later:
///
/// - a new file there is refused with a [`StoreError::Open`] naming it, and nothing is created;
/// - an existing store there, which the user may write, is either refused the same way (a
///   store that must make files beside its file: SQLite's log and index) and left byte for
///   byte as it was, or opened as a store that works: its first recording commits, and is in
///   the file afterwards, with no file made beside it. An open that succeeds and then fails
///   on the first write fails the check.
///
/// Either way the store opens afterwards, once the directory is writable, with its events.
#[cfg(unix)]
pub async fn a_directory_without_write_permission_gives_a_clear_error(
    f: impl OpenFile,
    test: ThisTest,
) {
    if attempt_when_asked(&f).await {
        return;
    }
    let (outer, locked, existing) = a_store_of_one_event(&f, "locked").await;
    let kid = child();
    if is_root(outer.path()) {
        std::os::unix::fs::chown(&existing, Some(NOBODY), Some(NOBODY))
            .expect("give the store to nobody");
    }
    set_mode(&locked, 0o555);
    let before = contents(&locked);

    let fresh = locked.join("fresh");
    let answer = as_another_user(test, outer.path(), &fresh);
    assert_refused_naming(
        "a new file in a directory without write permission",
        &answer,
        &fresh,
    );
    assert!(
        contents(&locked) == before,
        "a refused open in a directory without write permission created nothing"
    );

    let answer = as_another_user(test, outer.path(), &existing);
    let recorded = match &answer {
        Attempt::Refused { .. } => {
            assert_refused_naming(
                "a store in a directory without write permission",
                &answer,
                &existing,
            );
            unchanged_by_a_refused_open(&locked, &before);
            0
        }
        Attempt::Opened { first_write } => {
            let seq = first_write.as_ref().unwrap_or_else(|e| {
                panic!(
                    "a store in a directory without write permission opened, and its first \
                     write failed: {e}"
                )
            });
            assert_eq!(*seq, 2, "the first write after the store's one event");
            let after = contents(&locked);
            assert!(
                after.keys().eq(before.keys()),
                "an open in a directory without write permission left files beside the store: \
                 before {:?}, after {:?}",
                sizes(&before),
                sizes(&after)
            );
            1
        }
    };
    set_mode(&locked, 0o755);
    let t = open(&f, &existing).await;
    assert_eq!(
        t.store.state_version(&kid).await.expect("version"),
        Sequence(1 + recorded),
        "the store is intact"
    );
    t.close().await;
}

/// An open of a store's file the user may not write (mode 0444; as root, root's file of mode
/// 0644, opened by `nobody` in a process of its own), in a directory the user may write, is
/// refused with a [`StoreError::Open`] naming the file, and the file is left byte for byte as
/// it was. A store that opened such a file read-only without a word would fail every write
/// later, with an error that said neither the file nor why.
#[cfg(unix)]
pub async fn a_store_file_the_user_may_not_write_gives_a_clear_error(
    f: impl OpenFile,
    test: ThisTest,
) {
    if attempt_when_asked(&f).await {
        return;
    }
    let (outer, open_dir, existing) = a_store_of_one_event(&f, "open").await;
    set_mode(&open_dir, 0o777);
    // Root's file, readable by others, is not theirs to write; a user's own file is made
    // read-only.
    set_mode(&existing, if is_root(outer.path()) { 0o644 } else { 0o444 });
    let bytes = std::fs::read(&existing).expect("read the store");

    let answer = as_another_user(test, outer.path(), &existing);
    assert_refused_naming("a store file the user may not write", &answer, &existing);
    assert!(
        std::fs::read(&existing).expect("read the store") == bytes,
        "a refused open wrote into the file"
    );
    opens_intact(&f, &existing).await;
}

/// An open of a store's file the user may not read (as root, root's file of mode 0600 opened by
/// `nobody` in a process of its own; otherwise the user's own file made 0200), in a directory
/// the user may write, is refused with a [`StoreError::Open`] naming the file, of kind
/// [`OpenFailure::PermissionDenied`], and nothing in the directory changes. (A mutation review
/// removed store-sqlite's look at the file when SQLite says only that it cannot open it, which
/// then answered `Other`, and every test passed: they ran as root, which reads every file.)
#[cfg(unix)]
pub async fn a_store_file_the_user_may_not_read_gives_a_clear_error(
    f: impl OpenFile,
    test: ThisTest,
) {
    if attempt_when_asked(&f).await {
        return;
    }
    let (outer, open_dir, existing) = a_store_of_one_event(&f, "open").await;
    set_mode(&open_dir, 0o777);
    set_mode(&existing, if is_root(outer.path()) { 0o600 } else { 0o200 });
    let before = contents(&open_dir);

    let answer = as_another_user(test, outer.path(), &existing);
    assert_refused_naming("a store file the user may not read", &answer, &existing);
    unchanged_by_a_refused_open(&open_dir, &before);
    opens_intact(&f, &existing).await;
}

/// An open of a store in a directory the user may not search (mode 0666: its names can be
/// listed, none looked up; as root, the opener is `nobody`, in a process of its own) is refused
/// with a [`StoreError::Open`] naming the file, of kind [`OpenFailure::PermissionDenied`],
/// whether the store is there or would be new, and nothing in the directory changes. (A
/// mutation review made store-sqlite answer `Other` where it could not look at the path, and
/// every test passed: they ran as root, which searches every directory; review of stop 71,
/// SB36.)
#[cfg(unix)]
pub async fn a_directory_the_user_may_not_search_gives_a_clear_error(
    f: impl OpenFile,
    test: ThisTest,
) {
    if attempt_when_asked(&f).await {
        return;
    }
    let (outer, hidden, existing) = a_store_of_one_event(&f, "hidden").await;
    let before = contents(&hidden);
    set_mode(&hidden, 0o666);
    for path in [existing.clone(), hidden.join("fresh")] {
        let answer = as_another_user(test, outer.path(), &path);
        assert_refused_naming(
            "a store in a directory the user may not search",
            &answer,
            &path,
        );
    }
    set_mode(&hidden, 0o755);
    unchanged_by_a_refused_open(&hidden, &before);
    opens_intact(&f, &existing).await;
}

/// Makes the store of [`a_store_of_one_event`] its owner's again (mode 0600), and checks that
/// it opens with its one event.
#[cfg(unix)]
async fn opens_intact(f: &impl OpenFile, existing: &Path) {
    set_mode(existing, 0o600);
    let t = open(f, existing).await;
    assert_eq!(
        t.store.state_version(&child()).await.expect("version"),
        Sequence(1),
        "the store is intact"
    );
    t.close().await;
}
