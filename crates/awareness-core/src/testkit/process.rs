//! A writer process of a reliability test: a helper binary the test starts, reads line by
//! line, kills with SIGKILL or lets finish, failing with what the process wrote on stderr
//! when it does not do what the test expects. Unix only (SIGKILL).

use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A started process and the lines it prints on stdout, read on a thread of their own.
pub struct Writer {
    /// The process (its stdin is piped: a test may take it to say "go").
    pub child: Child,
    lines: mpsc::Receiver<String>,
    hang: Duration,
}

impl Writer {
    /// Starts `program` with `args`, stdin, stdout and stderr piped. `hang` bounds every wait
    /// for it (a hang guard, never a timing assertion).
    ///
    /// # Panics
    ///
    /// When the process cannot be started.
    pub fn start(program: &str, args: &[&str], hang: Duration) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines, hang }
    }

    /// What the process wrote on stderr, once it has ended.
    pub fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut text);
        }
        text
    }

    /// Kills the process if it still runs and fails the test, saying how it ended and what it
    /// wrote on stderr.
    pub fn fail(&mut self, what: &str) -> ! {
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait for the process");
        panic!("{what} ({status}); its stderr:\n{}", self.stderr());
    }

    /// The next line; fails (killing the process) when it ends or says nothing for the hang
    /// guard.
    pub fn next_line(&mut self, what: &str) -> String {
        match self.lines.recv_timeout(self.hang) {
            Ok(line) => line,
            Err(e) => self.fail(&format!("{what}: no line ({e})")),
        }
    }

    /// Kills the process (SIGKILL) and returns the lines it printed before it died; fails if it
    /// had ended on its own or said something on stderr (a writer that failed just before the
    /// kill said why).
    pub fn kill(mut self, what: &str) -> Vec<String> {
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("wait for the process");
        let stderr = self.stderr();
        assert!(
            status.signal() == Some(9) && stderr.is_empty(),
            "{what}: the writer ended on its own or complained, it was not just killed ({status}); its stderr:\n{stderr}"
        );
        // The reader ends at EOF, once the dead process's pipe is drained.
        self.lines.iter().collect()
    }

    /// Every line the process prints until it exits, which must be a success within the hang
    /// guard.
    pub fn finish(mut self, what: &str) -> Vec<String> {
        let deadline = Instant::now() + self.hang;
        let mut lines = Vec::new();
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => lines.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let hang = self.hang;
                    self.fail(&format!("{what} hung: not done after {hang:?}"))
                }
            }
        }
        if !self.child.wait().expect("wait for the process").success() {
            self.fail(&format!("{what} failed"));
        }
        lines
    }
}
