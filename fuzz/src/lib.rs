//! Fuzz targets for the parsers and readers that take what another program wrote, each a
//! function of any bytes that panics when its oracle disagrees ([`core_fit`], [`sqlite_rows`],
//! [`redb_rows`], [`transcript_line`], [`upstream_markers`], [`jsonl_scan`],
//! [`paired_thread`]). libFuzzer runs them through the binaries in `fuzz_targets/`
//! (README.md); this crate's tests run each on its seeds in `seeds/<target>/` (the inputs that
//! found a bug among them) and on inputs mutated from them, so that CI checks the oracles
//! without libFuzzer.

pub mod core_fit;
pub mod jsonl_scan;
pub mod paired_thread;
pub mod redb_rows;
pub mod sqlite_rows;
pub mod transcript_line;
pub mod upstream_markers;

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Inputs mutated from each seed: enough to reach past the seeds in a second or two.
    const MUTANTS: usize = 300;

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

    /// `seed` with a few bytes flipped, inserted, removed or copied from elsewhere in it.
    fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
        let mut out = seed.to_vec();
        for _ in 0..=rng.below(4) {
            let at = rng.below(out.len() + 1);
            match rng.below(4) {
                0 if at < out.len() => out[at] ^= 1 << rng.below(8),
                1 => out.insert(at, rng.next() as u8),
                2 if at < out.len() => {
                    out.remove(at);
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

    /// `run` on every seed of `target`, then on [`MUTANTS`] mutants of each.
    fn check(target: &str, run: fn(&[u8])) {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for (name, seed) in seeds(target) {
            run(&seed);
            for _ in 0..MUTANTS {
                let input = mutate(&seed, &mut rng);
                let caught = std::panic::catch_unwind(|| run(&input));
                assert!(
                    caught.is_ok(),
                    "{target}: a mutant of {name} fails: {input:?}"
                );
            }
        }
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
