//! Process-level reliability tests (being written).
fn main() {}
