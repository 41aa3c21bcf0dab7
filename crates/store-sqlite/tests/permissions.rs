//! store-sqlite runs the checks of an open by a user who may not write the store's directory or
//! its file (`awareness_core::permission_suite!`), in a test binary of their own: each starts
//! this binary again as another user, which no other test may run beside. So do two checks of
//! its own below (what a refused open leaves beside the file), one at a time with them.

use std::path::PathBuf;
use std::sync::Arc;

use awareness_core::StoreError;
use awareness_core::testkit::Subject;
use store_sqlite::SqliteStore;

awareness_core::raw_access_forwarding!(SqliteStore);

/// Opens `path` read-write as a [`Subject`], creating it when missing.
async fn open(path: PathBuf) -> Result<Subject, StoreError> {
    let store = Arc::new(SqliteStore::open(path).await?);
    Ok(Subject {
        store: store.clone(),
        upstream: store.clone(),
        raw: Arc::new(Raw(store)),
        batching: None,
        guard: Box::new(()),
    })
}

awareness_core::permission_suite!(open);

/// What the check below makes an open as another user do.
#[cfg(unix)]
mod as_another_user {
    use std::collections::BTreeMap;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    use std::path::{Path, PathBuf};

    use awareness_core::{
        ActorType, AwarenessStoreExt as _, EventKind, EventStore as _, NewEvent, Sequence,
        SessionRef, StoreError, Timestamp,
    };
    use store_sqlite::SqliteStore;

    /// Set on this test binary started again as another user: the store to open.
    const OPEN_THIS: &str = "STORE_SQLITE_TEST_OPEN_AS_ANOTHER_USER";
    /// The line before the child's answer.
    const REPORT: &str = "store-sqlite-open-report: ";
    /// `nobody`, whom a root process opens as (root ignores modes).
    const NOBODY: u32 = 65_534;

    fn session() -> SessionRef {
        SessionRef::parse("agent:main:subagent:kid", "main").expect("a session")
    }

    async fn record(store: &SqliteStore) -> Result<u64, StoreError> {
        let e = NewEvent::new(
            session(),
            EventKind::HumanDirectMessage,
            ActorType::Human,
            "hi",
        );
        store
            .record(e, Timestamp(1_800_000_000_000))
            .await
            .map(|r| r.event.sequence.get())
    }

    /// In the child: opens the path it is given, records once when it opened, and reports
    /// (`opened <sequence or error>`, or `refused <the path a StoreError::Open named> <message>`).
    /// Answers whether this process is that child.
    pub fn attempt_when_asked() -> bool {
        let Some(path) = std::env::var_os(OPEN_THIS) else {
            return false;
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let report = rt.block_on(async {
            match SqliteStore::open(PathBuf::from(path)).await {
                Ok(store) => {
                    let first = record(&store).await;
                    store.close().await;
                    format!("opened {first:?}")
                }
                Err(e) => {
                    let named = match &e {
                        StoreError::Open { path, .. } => path.display().to_string(),
                        _ => "-".to_owned(),
                    };
                    format!("refused {named} {e}")
                }
            }
        });
        println!("{REPORT}{}", report.replace('\n', " "));
        true
    }

    /// Opens `path` as another user (the test `name` started again) and asserts the open was
    /// refused, naming the file, and left `dir` exactly as it was.
    pub fn refused_leaving_nothing(name: &str, outer: &Path, dir: &Path, path: &Path) {
        let before = listing(dir);
        let report = open_as_another_user(name, outer, path);
        assert_refused(&report, path);
        let after = listing(dir);
        assert!(
            after == before,
            "a refused open changed the directory: before {:?}, after {:?}",
            names(&before),
            names(&after)
        );
    }

    pub fn is_root() -> bool {
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }

    pub fn set_mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
    }

    pub fn give_to_nobody(path: &Path) {
        std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).expect("chown to nobody");
    }

    /// Every file in `dir`, by name, with its owner, mode and bytes.
    pub fn listing(dir: &Path) -> BTreeMap<String, (u32, u32, Vec<u8>)> {
        std::fs::read_dir(dir)
            .expect("list the directory")
            .map(|entry| {
                let path = entry.expect("an entry").path();
                let meta = std::fs::metadata(&path).expect("metadata");
                let name = path
                    .file_name()
                    .expect("a name")
                    .to_string_lossy()
                    .into_owned();
                let bytes = std::fs::read(&path).unwrap_or_default();
                (name, (meta.uid(), meta.mode() & 0o7777, bytes))
            })
            .collect()
    }

    /// Only the names, owners and modes of a listing, for a message.
    pub fn names(listing: &BTreeMap<String, (u32, u32, Vec<u8>)>) -> Vec<String> {
        listing
            .iter()
            .map(|(name, (uid, mode, _))| format!("{name} (uid {uid}, mode {mode:o})"))
            .collect()
    }

    /// A store at `dir/state.db` holding one event, closed; `outer` (which holds `dir`) may
    /// be entered by anyone.
    pub fn a_store_of_one_event(outer: &Path, dir: &Path) -> PathBuf {
        set_mode(outer, 0o755);
        std::fs::create_dir(dir).expect("the store's directory");
        let path = dir.join("state.db");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let store = SqliteStore::open(&path).await.expect("open");
            assert_eq!(record(&store).await.expect("record"), 1);
            store.close().await;
        });
        path
    }

    /// The store's events, read by this process.
    pub fn version(path: &Path) -> Sequence {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let store = SqliteStore::open(path).await.expect("open");
            let v = store.state_version(&session()).await.expect("version");
            store.close().await;
            v
        })
    }

    /// Opens `path` in this test binary (`test`, run alone) started again, as `nobody` when
    /// this process is root, and answers its report. The binary is started where it is when
    /// that user may, and otherwise from `outer`, which anyone may enter; a child that hangs is
    /// killed after a deadline, and the test fails saying so (the shared suite's helpers).
    pub fn open_as_another_user(test: &str, outer: &Path, path: &Path) -> String {
        use awareness_core::testkit::open::{output_within, test_binary_for};
        use std::os::unix::process::CommandExt as _;
        let as_nobody = is_root();
        let mut cmd = std::process::Command::new(test_binary_for(outer, as_nobody));
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(OPEN_THIS, path)
            .current_dir(outer);
        if as_nobody {
            cmd.uid(NOBODY).gid(NOBODY);
        }
        let what = format!(
            "the test binary started again to open {} ({test})",
            path.display()
        );
        let out = output_within(&mut cmd, &what);
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout
            .lines()
            .find_map(|line| line.split_once(REPORT).map(|(_, r)| r.to_owned()))
            .unwrap_or_else(|| {
                panic!(
                    "the test binary started again reported nothing ({}):\n{stdout}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    }

    /// Asserts that `report` is a refusal with a `StoreError::Open` naming `path`, saying the
    /// user may not write it.
    pub fn assert_refused(report: &str, path: &Path) {
        let expected = format!("refused {} ", path.display());
        assert!(
            report.starts_with(&expected) && report.contains("this user may not write the file"),
            "a refusal naming {} that says the user may not write it: {report}",
            path.display()
        );
    }
}

/// A refused open of a store file the user may not write (their own file, mode 0444, in a
/// directory they may write; as root, `nobody`'s file, opened by `nobody` in a process of its
/// own) creates nothing beside it: SQLite's `-wal` and `-shm`, made with the file's mode by the
/// first read of a connection that opened it read-only, were left behind, and blocked the
/// next open once the file was made writable (opened read-only in turn, and refused again).
/// Once the file is the user's to write, the open succeeds and a recording commits.
#[cfg(unix)]
#[test]
fn a_refused_open_of_a_file_the_user_may_not_write_leaves_nothing_behind() {
    use as_another_user::*;
    const NAME: &str = "a_refused_open_of_a_file_the_user_may_not_write_leaves_nothing_behind";
    let _one_at_a_time = awareness_core::testkit::open::one_at_a_time();
    if attempt_when_asked() {
        return;
    }
    let outer = tempfile::tempdir().expect("temp dir");
    let dir = outer.path().join("open");
    let path = a_store_of_one_event(outer.path(), &dir);
    set_mode(&dir, 0o777);
    if is_root() {
        give_to_nobody(&path);
    }
    set_mode(&path, 0o444);
    refused_leaving_nothing(NAME, outer.path(), &dir, &path);

    set_mode(&path, 0o600);
    let report = open_as_another_user(NAME, outer.path(), &path);
    assert_eq!(
        report, "opened Ok(2)",
        "the file made writable opens, and records after its one event"
    );
    assert_eq!(
        version(&path),
        awareness_core::Sequence(2),
        "the store holds both"
    );
}

/// A refused open of another user's store file in a shared sticky directory (mode 1777, as
/// `/tmp`; root's file of mode 0644, opened by `nobody`) creates nothing beside it: no `-wal`
/// or `-shm` owned by the refused user, which its owner then could not write. Root only (a
/// file of another user is needed).
#[cfg(unix)]
#[test]
fn a_refused_open_of_another_users_file_in_a_sticky_directory_leaves_nothing_behind() {
    use as_another_user::*;
    const NAME: &str =
        "a_refused_open_of_another_users_file_in_a_sticky_directory_leaves_nothing_behind";
    let _one_at_a_time = awareness_core::testkit::open::one_at_a_time();
    if attempt_when_asked() || !is_root() {
        return;
    }
    let outer = tempfile::tempdir().expect("temp dir");
    let dir = outer.path().join("shared");
    let path = a_store_of_one_event(outer.path(), &dir);
    set_mode(&dir, 0o1777);
    set_mode(&path, 0o644);
    refused_leaving_nothing(NAME, outer.path(), &dir, &path);
    assert_eq!(
        version(&path),
        awareness_core::Sequence(1),
        "the store is intact"
    );
}
