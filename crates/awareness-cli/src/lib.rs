//! # awareness-cli
//!
//! The `awareness` command: `awareness demo` shows session state awareness working end to end on
//! the embedded default store (or `memory:`), and the operator commands inspect and repair any
//! state database (`sqlite:///path`, `redb:///path`), including one written by OpenClaw, and
//! operate a store shared on a PostgreSQL server
//! (`postgres://[user@]host[:port]/database[?schema=name]`).
//!
//! `awareness adopt` links a Claude Code transcript to a session and `awareness monitor` then
//! reports (and records) human turns typed straight into it, until Ctrl-C.
//!
//! Every read command prints an aligned table, or JSON with `--json`. Read commands never create a
//! store and never write to one (SQLite may add its `-wal` and `-shm` files beside a database it
//! reads). Only `record`, `watch`, `adopt` and `demo` create a store, in a missing or empty file
//! (another application's database they refuse, naming it, and add none of our tables to it); every
//! other command refuses a missing store with a failure naming the path, and creates nothing. A
//! PostgreSQL store has no read-only open: a read command opens it as a writer does, but only
//! where its schema holds a store already (a missing schema, or one without the store's tables,
//! is a failure naming the schema, and nothing is created), and then only reads; `repair` refuses
//! it as a usage error (the server recovers its own databases; there is no file of ours to
//! repair), and a URL sqlx cannot read is a usage error as any bad store URL is. A
//! `memory:` store lives only as long as the command: the demo (self-contained) and the read
//! commands take it, and every other command refuses it as a usage error (what it wrote would be
//! gone when it ends; `tail --follow` would wait for a store nothing else can write to). Every
//! command checks its input before it opens its store, so bad input is a usage error whether or not
//! the store exists, and it creates or migrates nothing; so are flags that contradict each other
//! (`--json demo`, a `record --watcher` its kind or session would drop). `unwatch` and `ack` of a
//! cursor a file does not hold fail so too: they look for it in a read-only open first. Errors are one line on
//! stderr, each starting `awareness: `: exit code 2 for usage errors (bad flags, a bad store URL,
//! bad input), 1 for failures (a missing file, an unknown session, a problem `doctor` found, a step
//! the demo narrates that did not happen), 75 ([`EXIT_TEMPFAIL`]) for a failure that may pass (the
//! store is busy, held by another process, or its PostgreSQL server is out of reach: the same
//! command may succeed later; the line ends with a hint saying so, unless the store's own words
//! say to try again already). A write whose output then cannot be printed says that it was
//! done. Output whose
//! reader has gone (`awareness tail --follow | head`) ends the command with exit code 141
//! ([`EXIT_CLOSED_PIPE`]) at its next write (a `tail --follow` on a quiet store, at the next
//! event), as SIGPIPE ends most Unix tools: silently for a read command and the
//! demo, saying what was done for any other write. Error lines (clap's included, what was typed
//! escaped within them) and `monitor` lines escape control characters, so each stays one line.
//!
//! The binary shows the warnings the libraries log on stderr, through [`log::Logger`]
//! (`AWARENESS_LOG` sets the level).
//!
//! The same entry point the binary uses can be driven from code:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let mut out = Vec::new();
//! let mut err = Vec::new();
//! let code = awareness_cli::run(
//!     ["awareness", "--store", "memory:", "--json", "list"],
//!     &mut out,
//!     &mut err,
//! )
//! .await;
//! assert_eq!(code, 0);
//! assert_eq!(String::from_utf8(out).unwrap().trim(), "[]");
//! # });
//! ```

mod commands;
mod demo;
pub mod log;
mod table;
mod upstream;

use std::ffi::OsString;
use std::io::Write;

use clap::{Parser, Subcommand};

/// Exit code of a usage error.
pub const EXIT_USAGE: i32 = 2;
/// Exit code of a failure.
pub const EXIT_FAILURE: i32 = 1;
/// Exit code of a failure that may pass: the store was busy, or its file is held by another
/// process ([`awareness_core::StoreError::is_retryable`],
/// [`awareness_core::OpenFailure::InUse`]); the same command may succeed later. 75 is
/// `EX_TEMPFAIL` of `sysexits.h`, which a script or a supervisor takes as "try again".
pub const EXIT_TEMPFAIL: i32 = 75;
/// What the line of an [`EXIT_TEMPFAIL`] failure ends with, unless it advises a retry already.
/// It names both causes `EX_TEMPFAIL` covers: a store another process holds, and a server not
/// reachable yet (store-postgres).
pub(crate) const TEMPFAIL_HINT: &str =
    "(another process holds the store, or its server is out of reach: try again)";
/// Exit code when the output's reader went away (a closed pipe): 141, a process's code when
/// SIGPIPE ends it, as it ends most Unix tools in `... | head`. Not 0: what the command had
/// still to say (a problem `doctor` found, a step the demo missed) was not said.
pub const EXIT_CLOSED_PIPE: i32 = 141;

/// The default store: a SQLite file in the current directory.
pub const DEFAULT_STORE: &str = "sqlite://awareness.db";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "awareness",
    version,
    about = "Session state awareness: demo and operator tools"
)]
pub struct Cli {
    /// The store: sqlite:///path (default: ./awareness.db), redb:///path, memory: (the demo
    /// and read commands only: it lives as long as the command), or
    /// postgres://user@host:port/database?schema=name (also postgresql://: sqlx's connection
    /// URL, whose user, port and query are optional, ?host=/socket/dir for a Unix socket; the
    /// schema is session_awareness when not named; a password in it is never printed).
    #[arg(long, global = true, default_value = DEFAULT_STORE)]
    pub store: String,
    /// Print JSON instead of text (every command that prints a result; `demo`, a narration,
    /// refuses it). `tail` prints one JSON object per line, one per event. `monitor` prints one
    /// JSON object per line: one per detection, `{"detection":"lagged","missed":N}` when its
    /// output fell behind and N detections were dropped, and, with `--verbose`,
    /// `{"detection":"tick","tick":N,"links":N,"checked":N,"unwatched":N,"deferred":N}` at the
    /// end of every tick. Neither prints anything else on stdout.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a narrated scenario through the real adapter and store, and leave the database behind.
    Demo,
    /// A session's stateVersion and, with --changes-since, the reconcile page.
    Status {
        /// The session key.
        key: String,
        /// The session's agent (default: the key's agent, else main).
        #[arg(long)]
        agent: Option<String>,
        /// Return the events after this version.
        #[arg(long)]
        changes_since: Option<u64>,
        /// At most this many events (1..=200; with `--changes-since`).
        #[arg(long, requires = "changes_since", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=awareness_core::reconcile::MAX_PAGE_LIMIT as u64))]
        limit: Option<usize>,
    },
    /// Sessions with their stateVersion.
    List {
        /// Only this agent's sessions.
        #[arg(long)]
        agent: Option<String>,
    },
    /// Watch cursors.
    Cursors {
        /// Only this watcher's cursors.
        #[arg(long)]
        watcher: Option<String>,
        /// Only cursors on this target.
        #[arg(long)]
        target: Option<String>,
        /// Only cursors with a pending notice.
        #[arg(long)]
        pending: bool,
    },
    /// Make WATCHER watch TARGET from its current head.
    Watch {
        /// The watcher (agent-qualified).
        watcher: String,
        /// The target.
        target: String,
        /// The target's agent (default: the target key's agent, else the watcher's).
        #[arg(long)]
        agent: Option<String>,
    },
    /// Remove WATCHER's cursor on TARGET.
    Unwatch {
        /// The watcher.
        watcher: String,
        /// The target.
        target: String,
    },
    /// Append one event.
    Record(commands::RecordArgs),
    /// Acknowledge WATCHER's notices on the TARGETs; says how many sessions it acknowledged
    /// (a target named twice counts once) and how many had a notice pending, then prints the
    /// follow-ups (with --json, the follow-ups alone).
    Ack {
        /// The watcher.
        watcher: String,
        /// The targets.
        #[arg(required = true)]
        targets: Vec<String>,
    },
    /// Re-freeze every pending cursor and print the notices to re-deliver.
    Sweep,
    /// Delete what retention says must go (30 days, 50,000 rows, idle cursors).
    Prune {
        /// Only say what would go.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print events as they land (with `--json`, one event object per line).
    Tail {
        /// Keep printing new events until Ctrl-C (or SIGTERM, SIGHUP).
        #[arg(long)]
        follow: bool,
        /// Start after this sequence (default: the last 20 events).
        #[arg(long)]
        after: Option<u64>,
    },
    /// Check the store: schema, heads against events, cursors against heads.
    Doctor,
    /// Ready a store whose writer crashed for read commands, creating no store: a redb file
    /// that read commands refuse (not closed cleanly, or of schema 1) is opened read-write once
    /// and closed cleanly, which repairs (or migrates) it; any other file, SQLite's always, is
    /// only checked read-only and left unchanged (`"repaired": false`). memory: and a
    /// PostgreSQL store (whose server recovers its own databases) have no file to repair: a
    /// usage error.
    Repair,
    /// Adopt a Claude Code transcript (a JSONL file) for a session: link it from its current
    /// end, so that only what is typed into it from now on counts, and record `adopted` (exit 1
    /// when that event could not be recorded: the link is kept, and adopting again records it).
    Adopt(upstream::AdoptArgs),
    /// Check adopted sessions that something watches for human turns typed straight into
    /// their transcript, printing each detection, until Ctrl-C (or SIGTERM, SIGHUP). It knows
    /// no gateway's prompts or runs: a prompt a gateway sends into the thread counts as a
    /// person's turn, so run it for threads only people type into.
    Monitor(upstream::MonitorArgs),
}

/// A failure with its exit code and one line for stderr (what [`run`] prints and returns).
#[derive(Debug)]
pub(crate) struct CliError {
    /// The exit code.
    pub(crate) code: i32,
    /// The message.
    pub(crate) message: String,
}

impl CliError {
    fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }

    fn failure(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_FAILURE,
            message: message.into(),
        }
    }

    /// A failure that may pass ([`EXIT_TEMPFAIL`]), its message ending with the hint unless it
    /// says to try again already (store-redb's refusal of a file another process has open).
    fn temporary(message: impl Into<String>) -> Self {
        let message = message.into();
        let message = if message.contains("try again") {
            message
        } else {
            format!("{message} {TEMPFAIL_HINT}")
        };
        Self {
            code: EXIT_TEMPFAIL,
            message,
        }
    }

    /// A write to the output that failed. A closed pipe (the reader is gone, as `head` does
    /// once it has its lines) stops the command without a message, there being nobody to tell,
    /// with [`EXIT_CLOSED_PIPE`].
    fn output(e: &std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Self {
                code: EXIT_CLOSED_PIPE,
                message: String::new(),
            };
        }
        Self::failure(format!("cannot write output: {e}"))
    }

    /// This failure, met after `done` was carried out (a write committed, say), saying so:
    /// nobody should run the write again to be sure it happened. Said on stderr even when the
    /// output's reader went away ([`EXIT_CLOSED_PIPE`]), which says nothing otherwise.
    fn after(self, done: &str) -> Self {
        let why = if self.message.is_empty() {
            "the output's reader went away"
        } else {
            &self.message
        };
        Self {
            message: format!("{done}, but {why}"),
            code: self.code,
        }
    }
}

/// Runs the command line `args` (the first is the program name), writing to `out` and `err`;
/// returns the exit code.
pub async fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            if code == 0 {
                let _ = write!(out, "{}", e.render());
            } else {
                let _ = writeln!(
                    err,
                    "awareness: {} (see awareness --help)",
                    parse_problem(e)
                );
            }
            return code;
        }
    };
    match commands::execute(&cli, out).await {
        Ok(code) => code,
        Err(e) => {
            // A quiet stop (the output's reader went away) has nothing to say.
            if !e.message.is_empty() {
                // One line, whatever a path or stored text in it holds.
                let line = log::one_line(&e.message);
                let _ = writeln!(err, "awareness: {}", table::printable(&line));
            }
            e.code
        }
    }
}

/// One clear line for clap's parse error `e`: its first paragraph (the problem, and for a
/// missing argument its name on the lines after) joined, without clap's `error: ` (the line
/// starts `awareness: `, as every other error line does); without a command, clap shows the
/// help, whose first paragraph is no error. What the user typed (a value, an argument) is
/// escaped as every error line escapes it ([`log::one_line`], [`table::printable`]) before the
/// message is made, so a line break in it neither cuts the reason short nor starts a line.
fn parse_problem(mut e: clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        return "a command is required".to_owned();
    }
    let escape = table::shown;
    let escaped: Vec<(ContextKind, ContextValue)> = e
        .context()
        .filter_map(|(kind, value)| {
            let value = match value {
                ContextValue::String(s) => ContextValue::String(escape(s)),
                ContextValue::Strings(v) => {
                    ContextValue::Strings(v.iter().map(|s| escape(s)).collect())
                }
                // The usage is clap's own lines, after the first paragraph.
                ContextValue::StyledStr(s) if kind != ContextKind::Usage => {
                    ContextValue::StyledStr(escape(&s.to_string()).into())
                }
                ContextValue::StyledStrs(v) => ContextValue::StyledStrs(
                    v.iter().map(|s| escape(&s.to_string()).into()).collect(),
                ),
                _ => return None,
            };
            Some((kind, value))
        })
        .collect();
    for (kind, value) in escaped {
        e.insert(kind, value);
    }
    let text = e.render().to_string();
    let first = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let first = first
        .strip_prefix("error:")
        .map_or(&*first, str::trim_start);
    // Whatever clap adds of its own (a value parser's reason) is escaped too.
    table::shown(first)
}
