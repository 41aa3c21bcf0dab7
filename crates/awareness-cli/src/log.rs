//! The `awareness` binary's log: the `tracing` events of the libraries it runs, one line each on
//! stderr. The libraries log with `warn!` every failure they carry on after (a best-effort
//! recording, a marker that did not move, a row ignored); without a subscriber those lines
//! went nowhere.
//!
//! The subscriber is written here rather than taken from `tracing-subscriber`: it needs one
//! level and one line format, which a few lines over `tracing`'s own `Subscriber` trait give
//! without another dependency. Spans are not shown (the libraries open none).

use std::ffi::OsStr;
use std::fmt::{self, Write as _};
use std::io::Write;
use std::sync::{Mutex, PoisonError};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// The environment variable that sets the most verbose level shown: `off`, `error`, `warn`
/// (the default), `info`, `debug` or `trace`.
pub const LOG_ENV: &str = "AWARENESS_LOG";

/// The level shown when [`LOG_ENV`] is unset or empty.
pub const DEFAULT_LEVEL: LevelFilter = LevelFilter::WARN;

/// A value of [`LOG_ENV`] that names no level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLogLevel {
    /// The value, as given (lossily decoded when it is not UTF-8).
    pub value: String,
}

impl fmt::Display for BadLogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{LOG_ENV}={:?} names no level (off, error, warn, info, debug or trace)",
            self.value
        )
    }
}

impl std::error::Error for BadLogLevel {}

/// The level a value of [`LOG_ENV`] names, in any case; [`DEFAULT_LEVEL`] when it is unset or
/// empty.
pub fn level_from(value: Option<&OsStr>) -> Result<LevelFilter, BadLogLevel> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(DEFAULT_LEVEL);
    };
    let text = value.to_string_lossy();
    Ok(match text.to_ascii_lowercase().as_str() {
        "off" => LevelFilter::OFF,
        "error" => LevelFilter::ERROR,
        "warn" => LevelFilter::WARN,
        "info" => LevelFilter::INFO,
        "debug" => LevelFilter::DEBUG,
        "trace" => LevelFilter::TRACE,
        _ => {
            return Err(BadLogLevel {
                value: text.into_owned(),
            });
        }
    })
}

/// A `tracing` subscriber that writes each event at `max` or above as one line,
/// `awareness: LEVEL target: message field=value ...`, to a writer (stderr in the binary).
///
/// Each line is one write under the subscriber's own lock, so lines from several threads do
/// not interleave. The writer must not be locked elsewhere for the whole run: the binary hands
/// the commands unlocked stdout and stderr handles, which lock per write.
pub struct Logger {
    max: LevelFilter,
    out: Mutex<Box<dyn Write + Send>>,
}

impl fmt::Debug for Logger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Logger")
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl Logger {
    /// A subscriber that shows events at `max` or above on `out`.
    pub fn new(max: LevelFilter, out: Box<dyn Write + Send>) -> Self {
        Self {
            max,
            out: Mutex::new(out),
        }
    }
}

/// Sets a [`Logger`] writing to stderr as the process's global subscriber; `false` when one
/// was already set (the first stays).
pub fn install(max: LevelFilter) -> bool {
    tracing::subscriber::set_global_default(Logger::new(max, Box::new(std::io::stderr()))).is_ok()
}

/// `text` with each line break and other control character written as an escape (`\n`,
/// `\u{1b}`), so that it stays one line.
pub(crate) fn one_line(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| match c {
            '\n' => "\\n".to_owned(),
            '\r' => "\\r".to_owned(),
            '\t' => "\\t".to_owned(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// Collects an event's fields: the message apart, the others as ` name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%value` fields come here too, wrapped so that `{:?}` shows their Display.
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= self.max
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Spans are not shown; every one gets the same id.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        if !self.enabled(meta) {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        let level = match *meta.level() {
            Level::ERROR => "ERROR",
            Level::WARN => "WARN",
            Level::INFO => "INFO",
            Level::DEBUG => "DEBUG",
            Level::TRACE => "TRACE",
        };
        let text = format!(
            "awareness: {level} {}: {}{}",
            meta.target(),
            line.message,
            line.fields
        );
        // One line per event, whatever a message or a value holds (a path, an SQL text), shown
        // in order (a key another writer left may hold a right-to-left override).
        let mut text = crate::table::printable(&one_line(&text)).into_owned();
        text.push('\n');
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        // A log line that cannot be written is dropped: there is nowhere else to say so.
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A writer whose bytes the test reads back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A message or a value over several lines is written as one line, its breaks escaped.
    #[test]
    fn an_event_over_several_lines_is_written_as_one() {
        let written = Shared::default();
        let logger = Logger::new(LevelFilter::WARN, Box::new(written.clone()));
        tracing::subscriber::with_default(logger, || {
            tracing::warn!(statement = "\n\nSELECT 1\n", "slow\nstatement");
        });
        let text = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(
            text.contains("slow\\nstatement statement=\\n\\nSELECT 1\\n"),
            "{text:?}"
        );
    }

    /// A right-to-left override in a logged key is written as its escape, so the line shows in
    /// order.
    #[test]
    fn a_bidirectional_override_is_logged_as_its_escape() {
        let written = Shared::default();
        let logger = Logger::new(LevelFilter::WARN, Box::new(written.clone()));
        tracing::subscriber::with_default(logger, || {
            tracing::warn!(session_key = %"agent:main:\u{202E}x", "skipped");
        });
        let text = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("session_key=agent:main:\\u202Ex"), "{text:?}");
    }

    /// A `warn!` reaches the writer as one line with its fields; below the level, nothing does.
    #[test]
    fn a_warning_reaches_the_writer_and_debug_does_not() {
        let written = Shared::default();
        let logger = Logger::new(LevelFilter::WARN, Box::new(written.clone()));
        tracing::subscriber::with_default(logger, || {
            tracing::warn!(session_key = %"agent:main:x", error = "busy", "event not recorded");
            tracing::debug!("not shown");
        });
        let text = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            format!(
                "awareness: WARN {}: event not recorded session_key=agent:main:x error=busy\n",
                module_path!()
            )
        );
    }

    /// Every level has its own name in `AWARENESS_LOG` and its own label on the line: `error`
    /// shows errors alone, and an error is labelled ERROR. (What the mutations did: `error` read
    /// as `warn`, and an error labelled WARN; review of stop 65, CU10 and CU12.)
    #[test]
    fn every_level_has_its_name_and_its_label() {
        assert_eq!(level_from(None), Ok(LevelFilter::WARN));
        assert_eq!(level_from(Some(OsStr::new(""))), Ok(LevelFilter::WARN));
        assert_eq!(
            level_from(Some(OsStr::new("DEBUG"))),
            Ok(LevelFilter::DEBUG)
        );
        for (name, level) in [
            ("off", LevelFilter::OFF),
            ("error", LevelFilter::ERROR),
            ("warn", LevelFilter::WARN),
            ("info", LevelFilter::INFO),
            ("debug", LevelFilter::DEBUG),
            ("trace", LevelFilter::TRACE),
        ] {
            assert_eq!(level_from(Some(OsStr::new(name))), Ok(level), "{name}");
        }
        let written = Shared::default();
        let logger = Logger::new(LevelFilter::TRACE, Box::new(written.clone()));
        tracing::subscriber::with_default(logger, || {
            tracing::error!("e");
            tracing::warn!("w");
            tracing::info!("i");
            tracing::debug!("d");
            tracing::trace!("t");
        });
        let text = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
        let labels: Vec<&str> = text
            .lines()
            .map(|l| l.split(' ').nth(1).unwrap_or_default())
            .collect();
        assert_eq!(
            labels,
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"],
            "{text}"
        );
        let bad = level_from(Some(OsStr::new("loud"))).unwrap_err();
        assert_eq!(
            bad.to_string(),
            "AWARENESS_LOG=\"loud\" names no level (off, error, warn, info, debug or trace)"
        );
    }

    /// A carriage return and a tab in a line are written as `\r` and `\t`, as a line break is
    /// `\n`; other control characters as their Unicode escape. (A `\r` written `\u{d}` passed
    /// every test: review of stop 63, L08.)
    #[test]
    fn a_carriage_return_and_a_tab_are_written_as_their_escapes() {
        assert_eq!(one_line("a\rb\tc\nd\u{7}"), "a\\rb\\tc\\nd\\u{7}");
    }
}
