//! `awareness demo` driven from code: a demo that fails midway still leaves what it recorded in
//! the database file itself.

use std::io::{self, Write};
use std::path::Path;

use serde_json::Value;

/// Output that takes writes until what it has taken contains `needle`, and fails every write
/// after that, as a closed pipe would.
struct FailsAfter {
    taken: Vec<u8>,
    needle: &'static str,
}

impl Write for FailsAfter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if String::from_utf8_lossy(&self.taken).contains(self.needle) {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the reader left"));
        }
        self.taken.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The refs with a head in the store at `url`, through `awareness --json list`.
async fn listed(url: &str) -> Vec<Value> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = awareness_cli::run(
        ["awareness", "--store", url, "--json", "list"],
        &mut out,
        &mut err,
    )
    .await;
    assert_eq!(code, 0, "list on {url}: {}", String::from_utf8_lossy(&err));
    let list: Value = serde_json::from_slice(&out).expect("list prints JSON");
    list.as_array().expect("a JSON array").clone()
}

/// Copies the database file alone, without any file beside it (SQLite's `-wal` and `-shm`).
fn copy_alone(file: &Path, dir: &Path) -> std::path::PathBuf {
    let copy = dir
        .join("copy")
        .join(file.file_name().expect("a file name"));
    std::fs::create_dir_all(copy.parent().expect("a parent")).expect("create the copy's dir");
    std::fs::copy(file, &copy).expect("copy the file alone");
    copy
}

async fn a_demo_that_fails_midway_closes_its_store(scheme: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("demo.db");
    let url = format!("{scheme}://{}", file.display());
    // The two spawns and the human's five messages are recorded before this line is printed.
    let mut out = FailsAfter {
        taken: Vec::new(),
        needle: "the manager's queue holds",
    };
    let mut err = Vec::new();
    let code = awareness_cli::run(["awareness", "--store", &url, "demo"], &mut out, &mut err).await;
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, awareness_cli::EXIT_FAILURE, "{scheme}: {err}");
    assert!(err.contains("cannot write output"), "{scheme}: {err}");
    // Right away, as a process that exits on the error would leave it.
    let copy = copy_alone(&file, dir.path());
    let heads = listed(&format!("{scheme}://{}", copy.display())).await;
    assert_eq!(
        heads.len(),
        2,
        "{scheme}: the file alone holds the heads of both subagents: {heads:?}"
    );
}

// SQLite only: a redb store commits into the file itself (`Immediate`), and dropping its last
// handle closes the file at once, so on redb this could not fail without the close.
#[tokio::test]
async fn a_demo_that_fails_midway_closes_its_store_sqlite() {
    a_demo_that_fails_midway_closes_its_store("sqlite").await;
}
