//! Helpers shared by the tests that drive `awareness_cli::run` from code.

use std::io::{self, Write};

/// Output that takes writes until what it has taken contains `needle`, and fails every write
/// after that with `kind`, as a full disk or a closed pipe would (an empty `needle` fails the
/// first write).
pub struct FailsAfter {
    pub taken: Vec<u8>,
    pub needle: &'static str,
    pub kind: io::ErrorKind,
}

impl FailsAfter {
    /// Output that fails every write with `kind`.
    pub fn at_once(kind: io::ErrorKind) -> Self {
        Self {
            taken: Vec::new(),
            needle: "",
            kind,
        }
    }
}

impl Write for FailsAfter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if String::from_utf8_lossy(&self.taken).contains(self.needle) {
            return Err(io::Error::new(self.kind, "the output failed"));
        }
        self.taken.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
