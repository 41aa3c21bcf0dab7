//! Fuzz targets for the parsers and readers that take what another program wrote, each a
//! function of any bytes that panics when its oracle disagrees ([`core_fit`], [`sqlite_rows`],
//! [`redb_rows`], [`transcript_line`], [`upstream_markers`], [`jsonl_scan`],
//! [`paired_thread`]) and returns whether the oracle compared the code's answer with an
//! expected one at all (an input the code refuses, or gives up on, is compared with nothing).
//! libFuzzer runs them through the binaries in `fuzz_targets/` (README.md); this crate's tests
//! run each on its seeds in `seeds/<target>/` (the inputs that found a bug among them) and on
//! inputs mutated from them, so that CI checks the oracles without libFuzzer, and check that
//! every seed and enough of the mutants are compared (an oracle that compares nothing passes
//! everything).

pub mod core_fit;
pub mod jsonl_scan;
pub mod paired_thread;
pub mod redb_rows;
pub mod sqlite_rows;
pub mod transcript_line;
pub mod upstream_markers;

use gateway_adapter::upstream::CheckOutcome;
use serde_json::Value;

/// A provider's check that went through: the marker it leaves and, when it found human turns,
/// their count and the burst's dedupe id; `None` for any other outcome.
fn went_through(outcome: &CheckOutcome) -> Option<(Value, Option<(u32, String)>)> {
    match outcome {
        CheckOutcome::Unchanged { marker } => Some((marker.clone(), None)),
        CheckOutcome::HumanTurns {
            turns,
            dedupe_id,
            marker,
            ..
        } => Some((marker.clone(), Some((*turns, dedupe_id.clone())))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Inputs mutated from each seed: enough to reach past the seeds in a second or two.
    const MUTANTS: usize = 300;

    /// The share of a target's mutants that must be compared, in percent.
    const MIN_COMPARED_PERCENT: usize = 10;

    /// Seeds whose oracle is expected to compare nothing, by target and file name. Every other
    /// seed must compare, and these must not (so the list stays true).
    const NOT_COMPARED: &[(&str, &str)] = &[
        // The input that found the fast reader reading `-0` as 0 (serde_json reads a float,
        // which the store's integer fields refuse): the reader now gives up on it, and
        // serde_json decides, so nothing is compared. Kept so the bug stays found.
        ("sqlite_rows", "minus-zero"),
        // A stray byte of a byte order mark before a user row (at the file's start, where the
        // mark is incomplete, and at a later line's start, where no mark is): the line is no
        // row, so no check reports a turn, and the oracle checks that none is reported.
        ("jsonl_scan", "mark-byte-in-second-line"),
        ("jsonl_scan", "stray-mark-byte"),
    ];

    /// The seeds of `target`, by file name.
    fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("seeds")
            .join(target);
        let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| {
                let path = entry.expect("a seed").path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&path).expect("read a seed"))
            })
            .collect();
        out.sort();
        assert!(!out.is_empty(), "no seeds for {target}");
        out
    }

    /// A small xorshift generator: the same mutants at every run.
    struct Rng(u64);

    impl Rng {
        /// The generator of a seed's mutants, from its file name alone, so that adding or
        /// removing a seed leaves every other seed's mutants as they were.
        fn for_seed(name: &str) -> Self {
            // xorshift stays at 0 from 0.
            Self(awareness_core::upstream::fnv1a64(name.as_bytes()).max(1))
        }

        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// `seed` with a byte's bit flipped, a byte replaced, inserted or removed, or a piece of it
    /// copied over or into it elsewhere: one such change half the time, else two to five. (The
    /// changes that keep the length and the single ones keep more of the mutants readable, a
    /// length-prefixed redb row or a marker's JSON above all, so that the oracles compare.)
    fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
        let mut out = seed.to_vec();
        // One change half the time, else two to five.
        let changes = if rng.below(2) == 0 {
            1
        } else {
            2 + rng.below(4)
        };
        for _ in 0..changes {
            let at = rng.below(out.len() + 1);
            match rng.below(6) {
                0 if at < out.len() => out[at] ^= 1 << rng.below(8),
                1 if at < out.len() => out[at] = rng.next() as u8,
                2 => out.insert(at, rng.next() as u8),
                3 if at < out.len() => {
                    out.remove(at);
                }
                4 if at < out.len() => {
                    let from = rng.below(out.len());
                    let len = rng.below(8).min(out.len() - from).min(out.len() - at);
                    let piece = out[from..from + len].to_vec();
                    out[at..at + len].copy_from_slice(&piece);
                }
                _ if !out.is_empty() => {
                    let from = rng.below(out.len());
                    let len = rng.below(8).min(out.len() - from);
                    let piece = out[from..from + len].to_vec();
                    out.splice(at..at, piece);
                }
                _ => {}
            }
        }
        out
    }

    /// `run` on every seed of `target` (each must compare, but those in [`NOT_COMPARED`]),
    /// then on [`MUTANTS`] mutants of each, of which at least [`MIN_COMPARED_PERCENT`] percent
    /// must compare.
    fn check(target: &str, run: fn(&[u8]) -> bool) {
        let (mut mutants, mut compared) = (0usize, 0usize);
        for (name, seed) in seeds(target) {
            let expected = !NOT_COMPARED.contains(&(target, name.as_str()));
            assert_eq!(
                run(&seed),
                expected,
                "{target}: seed {name} {} (see NOT_COMPARED)",
                if expected {
                    "compares nothing"
                } else {
                    "compares, though listed as comparing nothing"
                }
            );
            let mut rng = Rng::for_seed(&name);
            let mut of_seed = 0;
            for _ in 0..MUTANTS {
                let input = mutate(&seed, &mut rng);
                let caught = std::panic::catch_unwind(|| run(&input));
                match caught {
                    Ok(c) => of_seed += usize::from(c),
                    Err(_) => panic!("{target}: a mutant of {name} fails: {input:?}"),
                }
            }
            eprintln!("{target}: {of_seed} of {MUTANTS} mutants of {name} compared");
            compared += of_seed;
            mutants += MUTANTS;
        }
        let share = format!(
            "{compared} of {mutants} mutants ({:.1}%)",
            compared as f64 * 100.0 / mutants as f64
        );
        eprintln!("{target}: {share} compared");
        assert!(
            compared * 100 >= mutants * MIN_COMPARED_PERCENT,
            "{target}: only {share} compared, under {MIN_COMPARED_PERCENT}%"
        );
    }
    #[test]
    fn core_fit() {
        check("core_fit", crate::core_fit::run);
    }

    #[test]
    fn sqlite_rows() {
        check("sqlite_rows", crate::sqlite_rows::run);
    }

    #[test]
    fn redb_rows() {
        check("redb_rows", crate::redb_rows::run);
    }

    #[test]
    fn transcript_line() {
        check("transcript_line", crate::transcript_line::run);
    }

    #[test]
    fn upstream_markers() {
        check("upstream_markers", crate::upstream_markers::run);
    }

    #[test]
    fn jsonl_scan() {
        check("jsonl_scan", crate::jsonl_scan::run);
    }

    #[test]
    fn paired_thread() {
        check("paired_thread", crate::paired_thread::run);
    }
}
