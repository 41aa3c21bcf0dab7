//! Rewrites the results in `benches/README.md` from the last measurements on this machine.
//!
//! Run after the benches (and, for the scale table, after the scale example):
//!
//! ```sh
//! cargo run -p awareness-benches --bin bench-report
//! ```
//!
//! It reads criterion's `<target>/criterion/<group>/<bench>/<backend>/new/estimates.json`
//! (the median's point estimate, in ns) and `benchmark.json` (the throughput, for events per
//! second), the p99 of recording beside a pruning pass that the `prune` bench saves in
//! `<target>/awareness-prune/<backend>.json`, and the scale example's
//! `<target>/awareness-scale/<backend>.json`, and replaces
//! what lies between `<!-- bench-report:begin -->` and `<!-- bench-report:end -->` in the
//! README. `<target>` is `CARGO_TARGET_DIR` or the workspace's `target`; a first argument names
//! another README.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use awareness_core::Timestamp;
use serde_json::Value;

const BEGIN: &str = "<!-- bench-report:begin -->";
const END: &str = "<!-- bench-report:end -->";

/// The suite's rows, in report order.
const ROWS: &[&str] = &[
    "record/0_watchers",
    "record/1_watchers",
    "record/10_watchers",
    "record/dedupe_hit",
    "record/concurrent_16_tasks",
    "reconcile/5",
    "reconcile/200",
    "sessions_list/500_refs",
    "acknowledge",
    "turn/0_notices",
    "turn/1_notices",
    "turn/10_notices",
    "turn/0_notices_100k_cursors",
    "sweep/100k_cursors",
    "pickup/100k_cursors",
    "prune/60k_to_50k",
];

/// Backends, in column order: the harness's, `record/concurrent_16_tasks`'s being the widest
/// (each durable store followed by its one-transaction-per-event twin).
fn columns() -> Vec<&'static str> {
    awareness_benches::group_commit_specs()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

/// One measurement: the median time of an iteration and the elements an iteration handles.
#[derive(Debug, Clone, Copy)]
struct Measured {
    median_ns: f64,
    elements: Option<f64>,
    /// When criterion wrote the estimate (its file's time).
    at: Option<SystemTime>,
}

impl Measured {
    fn per_second(self) -> Option<f64> {
        self.elements.map(|n| n * 1e9 / self.median_ns)
    }
}

fn main() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::env::args_os()
        .nth(1)
        .map_or_else(|| manifest.join("README.md"), PathBuf::from);
    let target = awareness_benches::target_dir();
    let results = read_criterion(&target.join("criterion"));
    let scale = read_by_backend(&target.join("awareness-scale"));
    let prune = read_by_backend(&target.join("awareness-prune"));
    // Nothing measured where it looked (criterion writes under the target directory cargo
    // names, or `./target` of where the bench binary ran): the table is left as it is, not
    // replaced by an empty one.
    if results.is_empty() {
        eprintln!(
            "bench-report: no criterion results under {}; {} left unchanged (run the suite with \
             `cargo bench -p awareness-benches --bench stores`, or set CARGO_TARGET_DIR to where \
             it wrote)",
            target.join("criterion").display(),
            readme.display()
        );
        std::process::exit(1);
    }
    let body = render(&results, &scale, &prune);
    let text = std::fs::read_to_string(&readme)
        .unwrap_or_else(|e| panic!("read {}: {e}", readme.display()));
    let (Some(b), Some(e)) = (text.find(BEGIN), text.find(END)) else {
        panic!("{} has no {BEGIN} ... {END} markers", readme.display());
    };
    let updated = format!("{}{BEGIN}\n{body}{}", &text[..b], &text[e..]);
    std::fs::write(&readme, updated).unwrap_or_else(|e| panic!("write {}: {e}", readme.display()));
    eprintln!(
        "bench-report: {} measurements, {} scale runs -> {}",
        results.len(),
        scale.len(),
        readme.display()
    );
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Every `new/estimates.json` under `dir`, keyed by its id (`record/0_watchers/memory`).
fn read_criterion(dir: &Path) -> BTreeMap<String, Measured> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            if path.file_name().is_some_and(|n| n == "new") {
                let estimates = path.join("estimates.json");
                let Some(median_ns) = read_json(&estimates)
                    .and_then(|v| v.pointer("/median/point_estimate").and_then(Value::as_f64))
                else {
                    continue;
                };
                let elements = read_json(&path.join("benchmark.json"))
                    .and_then(|v| v.pointer("/throughput/Elements").and_then(Value::as_f64));
                let id = d
                    .strip_prefix(dir)
                    .expect("under the criterion dir")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                out.insert(
                    id,
                    Measured {
                        median_ns,
                        elements,
                        at: modified(&estimates),
                    },
                );
            } else if path.file_name().is_none_or(|n| n != "report") {
                stack.push(path);
            }
        }
    }
    out
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Two measurements further apart than this are taken to come from different runs (a full
/// run of the suite took 8-10 minutes in the runs of 12-01, e.g. 17:30-17:40, and 14 minutes
/// on 12-03, 07:44-07:58).
const ONE_RUN: Duration = Duration::from_mins(30);

/// ` (from different runs: 13:16 and 14:02)` when the inputs of a ratio were measured further
/// apart than one run of the suite, else nothing: such a ratio compares two states of a
/// shared machine, not two stores.
fn apart(a: Measured, b: Measured) -> String {
    match (a.at, b.at) {
        (Some(x), Some(y)) if x.max(y).duration_since(x.min(y)).unwrap_or_default() > ONE_RUN => {
            format!(
                " (from different runs: {} and {})",
                hour(x.min(y)),
                hour(x.max(y))
            )
        }
        _ => String::new(),
    }
}

/// `12-01 13:16`, in UTC.
fn hour(t: SystemTime) -> String {
    let d = date(t);
    d["YYYY-".len().."YYYY-MM-DD HH:MM".len()].to_owned()
}

/// Results saved by `awareness_benches::save_result` in `dir` (the scale runs, the p99 beside
/// a pruning pass), by backend, each with the time it was saved.
fn read_by_backend(dir: &Path) -> BTreeMap<String, (Value, Option<SystemTime>)> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json")
            && let Some(v) = read_json(&path)
            && let Some(name) = v.get("backend").and_then(Value::as_str)
        {
            out.insert(name.to_owned(), (v, modified(&path)));
        }
    }
    out
}

/// `1.42 µs`, `246 µs`, `1.02 ms`, `3.10 s`: three significant digits.
fn time(ns: f64) -> String {
    let (v, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "µs")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    format!("{} {unit}", sig3(v))
}

fn sig3(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// `12.3k`, `1.05M`.
fn count(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", sig3(v / 1e6))
    } else if v >= 1e3 {
        format!("{}k", sig3(v / 1e3))
    } else {
        sig3(v)
    }
}

fn cell(m: Measured) -> String {
    match (m.per_second(), m.elements) {
        (Some(rate), Some(n)) => format!(
            "{} ev/s ({} per {n:.0} events)",
            count(rate),
            time(m.median_ns)
        ),
        _ => time(m.median_ns),
    }
}

/// When `t` was, in UTC ([`Timestamp::utc`], to the second).
fn date(t: SystemTime) -> String {
    let ms = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let mut s = Timestamp(ms).utc();
    s.truncate("YYYY-MM-DD HH:MM:SS".len());
    s + " UTC"
}

/// A target of the store issues: `what` measured against `bound`.
struct Target {
    what: String,
    measured: String,
    bound: String,
    /// measured / bound for an upper bound, measured / bound for a lower bound of a ratio.
    ratio: f64,
    met: bool,
}

fn targets(r: &BTreeMap<String, Measured>) -> Vec<Target> {
    let get = |id: &str| r.get(id).copied();
    let mut out = Vec::new();
    // Upper bounds in ns.
    for (backend, bench, bound_ns) in [
        ("sqlite", "record/0_watchers", 60_000.0),
        ("sqlite", "record/10_watchers", 75_000.0),
        ("sqlite", "reconcile/200", 240_000.0),
        ("sqlite", "reconcile/5", 40_000.0),
        ("memory", "record/0_watchers", 1_000.0),
        ("memory", "reconcile/200", 20_000.0),
        ("redb", "reconcile/200", 150_000.0),
    ] {
        if let Some(m) = get(&format!("{bench}/{backend}")) {
            out.push(Target {
                what: format!("{backend} {bench}"),
                measured: time(m.median_ns),
                bound: format!("≤ {}", time(bound_ns)),
                ratio: m.median_ns / bound_ns,
                met: m.median_ns <= bound_ns,
            });
        }
    }
    // Issue 4: redb's reconcile/200 faster than sqlite's in the same run.
    if let (Some(m), Some(s)) = (get("reconcile/200/redb"), get("reconcile/200/sqlite")) {
        let ratio = m.median_ns / s.median_ns;
        out.push(Target {
            what: "redb reconcile/200 / sqlite reconcile/200".into(),
            measured: format!(
                "{} / {}{}",
                time(m.median_ns),
                time(s.median_ns),
                apart(m, s)
            ),
            bound: "< 1x".into(),
            ratio,
            met: ratio < 1.0,
        });
    }
    // Issue 4: redb's record/0_watchers against the floor of the same durability, 1.5x at
    // most, in each mode (record/10_watchers has no bound against the floor).
    for (backend, floor) in [("redb", "immediate"), ("redb-bounded", "none")] {
        for bench in ["record/0_watchers"] {
            if let (Some(m), Some(f)) = (
                get(&format!("{bench}/{backend}")),
                get(&format!("floor/insert_one_key/{floor}")),
            ) {
                let ratio = m.median_ns / f.median_ns;
                out.push(Target {
                    what: format!("{backend} {bench} / floor insert ({floor})"),
                    measured: format!(
                        "{} / {}{}",
                        time(m.median_ns),
                        time(f.median_ns),
                        apart(m, f)
                    ),
                    bound: "≤ 1.5x".into(),
                    ratio,
                    met: ratio <= 1.5,
                });
            }
        }
    }
    // Group commit: events per second with it against one transaction per event, 5x at least.
    for backend in ["sqlite", "redb", "postgres"] {
        let id = |b: &str| format!("record/concurrent_16_tasks/{b}");
        let (Some(m_on), Some(m_off)) = (get(&id(backend)), get(&id(&format!("{backend}-1tx"))))
        else {
            continue;
        };
        if let (Some(on), Some(off)) = (m_on.per_second(), m_off.per_second()) {
            let ratio = on / off;
            out.push(Target {
                what: format!("{backend} group commit, 16 tasks: events/s on / off"),
                measured: format!("{} / {} ev/s{}", count(on), count(off), apart(m_on, m_off)),
                bound: "≥ 5x".into(),
                ratio,
                met: ratio >= 5.0,
            });
        }
    }
    out
}

fn render(
    r: &BTreeMap<String, Measured>,
    scale: &BTreeMap<String, (Value, Option<SystemTime>)>,
    prune: &BTreeMap<String, (Value, Option<SystemTime>)>,
) -> String {
    let mut s = String::new();
    let times = r.values().filter_map(|m| m.at);
    let when = match (times.clone().min(), times.max()) {
        (Some(a), Some(b)) => format!("measured from {} to {}", date(a), date(b)),
        _ => "no measurements found".into(),
    };
    let _ = writeln!(
        s,
        "Generated by `cargo run -p awareness-benches --bin bench-report` from the latest \
         measurement of each bench on this machine ({when}); criterion medians. A ratio whose \
         two inputs were measured more than 30 minutes apart says so.\n"
    );
    let columns: Vec<&str> = columns()
        .into_iter()
        .filter(|c| ROWS.iter().any(|row| r.contains_key(&format!("{row}/{c}"))))
        .collect();
    let _ = writeln!(s, "| bench | {} |", columns.join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(columns.len()));
    for row in ROWS {
        if !columns
            .iter()
            .any(|c| r.contains_key(&format!("{row}/{c}")))
        {
            continue;
        }
        let cells: Vec<String> = columns
            .iter()
            .map(|c| {
                r.get(&format!("{row}/{c}"))
                    .map_or(String::new(), |m| cell(*m))
            })
            .collect();
        let _ = writeln!(s, "| {row} | {} |", cells.join(" | "));
    }
    let floors: Vec<String> = ["immediate", "none"]
        .iter()
        .filter_map(|d| {
            let direct = r.get(&format!("floor/insert_one_key/{d}"))?;
            let spawned = r.get(&format!("floor/insert_one_key_spawn_blocking/{d}"));
            Some(format!(
                "`{d}` {} direct, {} through spawn_blocking",
                time(direct.median_ns),
                spawned.map_or_else(|| "-".into(), |m| time(m.median_ns))
            ))
        })
        .collect();
    if !floors.is_empty() {
        let _ = writeln!(
            s,
            "\nredb floor (a bare one-key insert per write transaction): {}.",
            floors.join("; ")
        );
    }
    if let (Some(trip), Some(insert)) = (
        r.get("floor/sqlx_round_trip/sqlite"),
        r.get("floor/sqlx_insert_one_row/sqlite"),
    ) {
        let _ = writeln!(
            s,
            "\nsqlite floor (sqlx on a file of its own, WAL, `synchronous=NORMAL`): {} a round \
             trip (`SELECT 1`), {} a bare one-row insert per write transaction.",
            time(trip.median_ns),
            time(insert.median_ns)
        );
    }
    if let Some(line) = postgres_floor(r) {
        let _ = writeln!(s, "\n{line}");
    }
    if let (Some(poll), Some(quiet), Some(polling)) = (
        r.get("hints/poll/sqlite"),
        r.get("hints/record_0_watchers/sqlite"),
        r.get("hints/record_0_watchers/sqlite-polling-1ms"),
    ) {
        let _ = writeln!(
            s,
            "\nsqlite commit hints (`PRAGMA data_version` polled, DESIGN.md 9.1): {} a poll asked \
             and answered; another handle's commit hinted {} after its recording began (a whole \
             interval); `record/0_watchers` {} on a handle polling every 1 ms against {} on \
             one not polling, {:.2}x{}.",
            time(poll.median_ns),
            r.get("hints/another_handles_commit/sqlite")
                .map_or_else(|| "-".into(), |m| time(m.median_ns)),
            time(polling.median_ns),
            time(quiet.median_ns),
            polling.median_ns / quiet.median_ns,
            apart(*polling, *quiet)
        );
    }
    let t = targets(r);
    if !t.is_empty() {
        let _ = writeln!(
            s,
            "\nAgainst the targets of the store issues (ratio = measured / bound; for group \
             commit, on / off):\n"
        );
        let _ = writeln!(s, "| target | measured | bound | ratio | met |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        for t in t {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.2}x | {} |",
                t.what,
                t.measured,
                t.bound,
                t.ratio,
                if t.met { "yes" } else { "no" }
            );
        }
    }
    if !prune.is_empty() {
        render_prune(&mut s, prune);
    }
    if !scale.is_empty() {
        render_scale(&mut s, scale);
    }
    s
}

/// The postgres floor's line: sqlx's round trip and bare one-row insert on the backend's
/// server, and postgres's `record/0_watchers` against the insert (a ratio with no bound: the
/// store issues set none for postgres).
fn postgres_floor(r: &BTreeMap<String, Measured>) -> Option<String> {
    let trip = r.get("floor/sqlx_round_trip/postgres")?;
    let insert = r.get("floor/sqlx_insert_one_row/postgres")?;
    let record = r
        .get("record/0_watchers/postgres")
        .map_or_else(String::new, |m| {
            format!(
                "; postgres `record/0_watchers` {}, {:.2}x the insert{}",
                time(m.median_ns),
                m.median_ns / insert.median_ns,
                apart(*m, *insert)
            )
        });
    Some(format!(
        "postgres floor (sqlx on the backend's server, a table of its own, the server's \
         `synchronous_commit`): {} a round trip (`SELECT 1`), {} a bare one-row insert per \
         transaction{record}.",
        time(trip.median_ns),
        time(insert.median_ns)
    ))
}

/// The backends of `by_backend` in the table's column order.
fn in_column_order<T>(by_backend: &BTreeMap<String, T>) -> Vec<&String> {
    let order = columns();
    let mut names: Vec<&String> = by_backend.keys().collect();
    names.sort_by_key(|n| order.iter().position(|c| c == n).unwrap_or(usize::MAX));
    names
}

/// When a saved result was written, for its row.
fn saved(at: Option<SystemTime>) -> String {
    at.map_or_else(|| "-".into(), hour)
}

fn render_prune(s: &mut String, prune: &BTreeMap<String, (Value, Option<SystemTime>)>) {
    let ns = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_f64)
            .map_or_else(|| "-".into(), time)
    };
    let _ = writeln!(
        s,
        "\nRecording while `prune/60k_to_50k` runs passes on another task, against recording \
         alone (nearest-rank p99; one recording at a time, round-robin over 1,000 sessions \
         outside the data set):\n"
    );
    let _ = writeln!(
        s,
        "| backend | quiet p99 | p99 during the passes | the slowest during them | recordings during them | passes | measured |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    let int = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .map_or_else(|| "-".into(), |n| n.to_string())
    };
    for name in in_column_order(prune) {
        let (v, at) = &prune[name];
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} | {} |",
            ns(v, "quiet_p99_ns"),
            ns(v, "pruning_p99_ns"),
            ns(v, "pruning_max_ns"),
            int(v, "recordings_during"),
            int(v, "passes"),
            saved(*at)
        );
    }
}

/// The least-squares slope of the RSS `samples` (MiB, one every `every` events) taken once the
/// data stopped growing: after `steady_from` events (the log at its row cap and every session
/// with its head), in MiB per 100,000 events; `None` with fewer than three such samples. (A
/// window of the second half threw away samples taken in the steady state, and understated
/// growth four times over: review, stop 57.) Without `steady_from` (a run saved before its row
/// cap was), the second half, as then.
fn rss_growth(samples: &[f64], every: f64, steady_from: Option<f64>) -> Option<f64> {
    let first = match steady_from {
        Some(steady_from) => (0_u32..)
            .zip(samples)
            .find(|(i, _)| f64::from(*i + 1) * every > steady_from)
            .map(|(i, _)| usize::try_from(i).ok())??,
        None => samples.len() / 2,
    };
    let ys = samples.get(first..).filter(|ys| ys.len() >= 3)?;
    let n = f64::from(u32::try_from(ys.len()).ok()?);
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = ys.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, y) in (0_u32..).zip(ys) {
        let dx = f64::from(i) - mean_x;
        sxy += dx * (y - mean_y);
        sxx += dx * dx;
    }
    Some(sxy / sxx * 100_000.0 / every)
}

fn render_scale(s: &mut String, scale: &BTreeMap<String, (Value, Option<SystemTime>)>) {
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let _ = writeln!(
        s,
        "\nScale (`examples/scale.rs`: recording from several tasks with the default retention \
         running). The reconcile is the median of 11 back-to-back reads of a 200-event page of \
         a session just written (a warm read); the files are sqlite's database, WAL and `-shm` \
         index, redb's one file, or postgres's tables and their indexes on the server (whose \
         memory is not in the process's figures). RSS growth is the least-squares slope of the RSS \
         samples taken once the data stopped growing (after the log reached its row cap and \
         every session had its head), in MiB per 100,000 events: 0 is flat; it is reported, not \
         checked. Pruning passes are asked for every 10,000 events and every second; the \
         column says how many began while recording and at most how many events apart.\n"
    );
    let _ = writeln!(
        s,
        "| backend | events / sessions / tasks | events/s | p50 / p99 record | reconcile/200 at \
         the end (warm) | pruning passes (events apart) | files (db, WAL, shm) | peak memory \
         (VmHWM) | RSS samples (MiB) | RSS growth | measured |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for name in in_column_order(scale) {
        let (v, at) = &scale[name];
        let samples: Vec<f64> = v
            .get("rss_kib")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .map(|k| k / 1024.0)
            .collect();
        let rss: Vec<String> = samples.iter().map(|m| format!("{m:.0}")).collect();
        // A run saved before its row cap was (stop 57) may have had any (`--max-rows`).
        let steady_from = v
            .get("max_rows")
            .and_then(Value::as_f64)
            .map(|max_rows| max_rows.max(num(v, "sessions")));
        let passes = match v.get("most_events_between_passes").and_then(Value::as_f64) {
            Some(gap) => format!(
                "{:.0} (at most {})",
                num(v, "prune_passes") - 1.0,
                count(gap)
            ),
            None => "-".into(),
        };
        let growth = rss_growth(&samples, num(v, "rss_every_events"), steady_from)
            .map_or_else(|| "-".into(), |g| format!("{g:+.2} MiB / 100k"));
        let _ = writeln!(
            s,
            "| {name} | {} / {} / {} | {} | {} / {} | {} | {passes} | {} | {:.1} MiB | every {}: {} \
             | {growth} | {} |",
            count(num(v, "events")),
            count(num(v, "sessions")),
            num(v, "tasks"),
            count(num(v, "events_per_sec")),
            time(num(v, "p50_ns")),
            time(num(v, "p99_ns")),
            time(num(v, "reconcile_200_ns")),
            v.get("file_bytes")
                .and_then(Value::as_f64)
                .map_or_else(|| "-".into(), |b| format!("{:.1} MiB", b / 1_048_576.0)),
            num(v, "vm_hwm_kib") / 1024.0,
            count(num(v, "rss_every_events")),
            rss.join(", "),
            saved(*at)
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::{Duration, SystemTime};

    use serde_json::{Value, json};

    use super::{
        Measured, apart, count, read_criterion, render, render_scale, rss_growth, targets, time,
    };

    /// 2027-01-15 08:00:00 UTC, and `mins` minutes after it.
    fn at(mins: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + mins * 60)
    }

    fn ns(median_ns: f64) -> Measured {
        Measured {
            median_ns,
            elements: None,
            at: None,
        }
    }

    /// An iteration of 16 recordings at `per_second` events per second.
    fn rate(per_second: f64) -> Measured {
        Measured {
            median_ns: 16.0 * 1e9 / per_second,
            elements: Some(16.0),
            at: None,
        }
    }

    fn results(rows: &[(&str, Measured)]) -> BTreeMap<String, Measured> {
        rows.iter().map(|(id, m)| ((*id).to_owned(), *m)).collect()
    }

    /// Asserts that the targets of `r` are `want`: (what, bound, ratio to two decimals, met).
    fn assert_targets(r: &BTreeMap<String, Measured>, want: &[(&str, &str, &str, bool)]) {
        let got: Vec<(String, String, String, bool)> = targets(r)
            .into_iter()
            .map(|t| (t.what, t.bound, format!("{:.2}", t.ratio), t.met))
            .collect();
        let want: Vec<(String, String, String, bool)> = want
            .iter()
            .map(|(what, bound, ratio, met)| {
                (
                    (*what).to_owned(),
                    (*bound).to_owned(),
                    (*ratio).to_owned(),
                    *met,
                )
            })
            .collect();
        assert_eq!(got, want);
    }

    /// The table reads each bench's `new/estimates.json` median (not its mean, not the `base`
    /// of an older run), keyed by group, bench and backend, and the elements of an iteration
    /// from `benchmark.json`'s `Elements` throughput, from which events per second follow.
    /// (What the mutation did: the mean, `Bytes` or `base/` read instead; review of stop 68,
    /// BR15, BR16, BR17.)
    #[test]
    fn read_criterion_takes_each_new_median_and_its_elements() {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |rel: &str, v: &Value| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(path, v.to_string()).expect("write");
        };
        let estimates = |median: f64, mean: f64| json!({"mean": {"point_estimate": mean}, "median": {"point_estimate": median}});
        write(
            "record/0_watchers/sqlite/new/estimates.json",
            &estimates(105_000.0, 999_000.0),
        );
        write(
            "record/0_watchers/sqlite/base/estimates.json",
            &estimates(1.0, 1.0),
        );
        write(
            "record/concurrent_16_tasks/redb/new/estimates.json",
            &estimates(400_000.0, 1.0),
        );
        write(
            "record/concurrent_16_tasks/redb/new/benchmark.json",
            &json!({"group_id": "record", "throughput": {"Elements": 16}}),
        );
        let r = read_criterion(dir.path());
        assert_eq!(
            r.keys().collect::<Vec<_>>(),
            [
                "record/0_watchers/sqlite",
                "record/concurrent_16_tasks/redb"
            ],
            "one result per bench's new/ directory"
        );
        let sqlite = r["record/0_watchers/sqlite"];
        assert_eq!(
            Some(sqlite.median_ns),
            Some(105_000.0),
            "the median of new/estimates.json"
        );
        assert_eq!(sqlite.elements, None);
        let redb = r["record/concurrent_16_tasks/redb"];
        assert_eq!(redb.elements, Some(16.0), "the Elements throughput");
        assert_eq!(redb.per_second(), Some(40_000.0), "16 events in 400 µs");
    }

    /// Each target of the store issues: an upper bound met at the bound itself, its ratio
    /// measured / bound; redb's reconcile/200 against sqlite's; each redb mode's
    /// record/0_watchers against the floor of its own durability (1.5x at most, met at 1.5x);
    /// group commit on / off, 5x at least (met at 5x), for sqlite, redb and postgres.
    /// (What the mutation did: a bound, a row, a ratio's direction, a floor's durability or a
    /// comparison changed; review of stop 68, BR23 to BR33.)
    #[test]
    fn targets_compare_each_measurement_with_its_bound() {
        let r = results(&[
            ("reconcile/5/sqlite", ns(40_000.0)),
            ("reconcile/200/sqlite", ns(200_000.0)),
            ("reconcile/200/redb", ns(100_000.0)),
            ("record/0_watchers/redb", ns(300_000.0)),
            ("record/0_watchers/redb-bounded", ns(30_000.0)),
            ("floor/insert_one_key/immediate", ns(200_000.0)),
            ("floor/insert_one_key/none", ns(10_000.0)),
            ("record/concurrent_16_tasks/sqlite", rate(40_000.0)),
            ("record/concurrent_16_tasks/sqlite-1tx", rate(8_000.0)),
            ("record/concurrent_16_tasks/redb", rate(20_000.0)),
            ("record/concurrent_16_tasks/redb-1tx", rate(5_000.0)),
            ("record/concurrent_16_tasks/postgres", rate(13_000.0)),
            ("record/concurrent_16_tasks/postgres-1tx", rate(1_300.0)),
        ]);
        assert_targets(
            &r,
            &[
                ("sqlite reconcile/200", "≤ 240 µs", "0.83", true),
                ("sqlite reconcile/5", "≤ 40.0 µs", "1.00", true),
                ("redb reconcile/200", "≤ 150 µs", "0.67", true),
                (
                    "redb reconcile/200 / sqlite reconcile/200",
                    "< 1x",
                    "0.50",
                    true,
                ),
                (
                    "redb record/0_watchers / floor insert (immediate)",
                    "≤ 1.5x",
                    "1.50",
                    true,
                ),
                (
                    "redb-bounded record/0_watchers / floor insert (none)",
                    "≤ 1.5x",
                    "3.00",
                    false,
                ),
                (
                    "sqlite group commit, 16 tasks: events/s on / off",
                    "≥ 5x",
                    "5.00",
                    true,
                ),
                (
                    "redb group commit, 16 tasks: events/s on / off",
                    "≥ 5x",
                    "4.00",
                    false,
                ),
                (
                    "postgres group commit, 16 tasks: events/s on / off",
                    "≥ 5x",
                    "10.00",
                    true,
                ),
            ],
        );
        // The targets those results leave out: sqlite's record/0_watchers and
        // record/10_watchers and memory's record/0_watchers and reconcile/200 against their own
        // bounds, and redb's reconcile/200 no faster than sqlite's not met. (What the mutation
        // did: a bound moved, record/1_watchers read for record/10_watchers, an equal reconcile
        // counted as faster; review of stop 72, BX18 to BX22.)
        let r = results(&[
            ("record/0_watchers/sqlite", ns(54_000.0)),
            ("record/1_watchers/sqlite", ns(1.0)),
            ("record/10_watchers/sqlite", ns(75_000.0)),
            ("record/0_watchers/memory", ns(2_000.0)),
            ("reconcile/200/memory", ns(10_000.0)),
            ("reconcile/200/sqlite", ns(100_000.0)),
            ("reconcile/200/redb", ns(100_000.0)),
        ]);
        assert_targets(
            &r,
            &[
                ("sqlite record/0_watchers", "≤ 60.0 µs", "0.90", true),
                ("sqlite record/10_watchers", "≤ 75.0 µs", "1.00", true),
                ("sqlite reconcile/200", "≤ 240 µs", "0.42", true),
                ("memory record/0_watchers", "≤ 1.00 µs", "2.00", false),
                ("memory reconcile/200", "≤ 20.0 µs", "0.50", true),
                ("redb reconcile/200", "≤ 150 µs", "0.67", true),
                (
                    "redb reconcile/200 / sqlite reconcile/200",
                    "< 1x",
                    "1.00",
                    false,
                ),
            ],
        );
    }

    /// The figures printed: three significant digits in the unit the value reaches (1,000 ns
    /// is 1.00 µs, 100 µs has no decimal).
    /// (What the mutation did: a unit's or a precision's bound moved by one; review of stop 68,
    /// BR21, BR22.)
    #[test]
    fn times_have_three_significant_digits() {
        assert_eq!(time(999.0), "999 ns");
        assert_eq!(time(1_000.0), "1.00 µs");
        assert_eq!(time(100_000.0), "100 µs");
        assert_eq!(time(99_500.0), "99.5 µs");
        assert_eq!(time(1_500_000.0), "1.50 ms");
        // Seconds from 1,000 ms, one decimal from 10, and `k` from 1,000 events per second.
        // (What the mutation did: seconds began at 10 s, 10.0 showed two decimals, 1,000 was no
        // `k`; review of stop 72, BX14, BX15, BX16.)
        assert_eq!(time(3_100_000_000.0), "3.10 s");
        assert_eq!(time(10_000.0), "10.0 µs");
        assert_eq!(count(1_000.0), "1.00k");
    }

    /// A ratio's two inputs saved more than 30 minutes apart are named, earlier first, in
    /// either order of the arguments; 29 minutes apart is one run.
    /// (What the mutation did: the comparison turned, the limit doubled, the two times
    /// swapped; review of stop 68, BR18, BR19, BR20.)
    #[test]
    fn apart_names_inputs_from_different_runs() {
        let when = |mins: u64| Measured {
            at: Some(at(mins)),
            ..ns(1.0)
        };
        assert_eq!(apart(when(0), when(29)), "");
        // 30 minutes exactly is still one run. (What the mutation did: `>=` for `>`; review of
        // stop 72, BX17.)
        assert_eq!(apart(when(0), when(30)), "");
        assert_eq!(
            apart(when(31), when(0)),
            " (from different runs: 01-15 08:00 and 01-15 08:31)"
        );
        assert_eq!(
            apart(when(0), when(45)),
            " (from different runs: 01-15 08:00 and 01-15 08:45)"
        );
    }

    /// The block: the time span of the measurements; a row per bench measured (none for a
    /// bench with no result), a throughput cell in events per second; the floors' lines with
    /// the right bench in each place, and their ratios (polling against quiet, postgres's
    /// recording against its insert).
    /// (What the mutation did: the span reversed, a throughput in the wrong unit, an empty row
    /// kept, a floor read from another bench, a ratio inverted or taken against the round
    /// trip; review of stop 68, BR14, BR34 to BR39.)
    #[test]
    fn render_puts_each_measurement_in_its_place() {
        let r = results(&[
            (
                "record/0_watchers/memory",
                Measured {
                    at: Some(at(10)),
                    ..ns(484.0)
                },
            ),
            (
                "record/0_watchers/sqlite",
                Measured {
                    at: Some(at(0)),
                    ..ns(105_000.0)
                },
            ),
            ("record/concurrent_16_tasks/sqlite", rate(40_000.0)),
            ("record/0_watchers/postgres", ns(581_000.0)),
            ("floor/insert_one_key/immediate", ns(181_000.0)),
            ("floor/insert_one_key/none", ns(12_000.0)),
            ("reconcile/5/sqlite", ns(40_000.0)),
            (
                "floor/insert_one_key_spawn_blocking/immediate",
                ns(205_000.0),
            ),
            ("floor/sqlx_round_trip/sqlite", ns(59_500.0)),
            ("floor/sqlx_insert_one_row/sqlite", ns(70_000.0)),
            ("floor/sqlx_round_trip/postgres", ns(64_000.0)),
            ("floor/sqlx_insert_one_row/postgres", ns(185_000.0)),
            ("hints/poll/sqlite", ns(72_000.0)),
            ("hints/another_handles_commit/sqlite", ns(21_400_000.0)),
            ("hints/record_0_watchers/sqlite", ns(100_000.0)),
            ("hints/record_0_watchers/sqlite-polling-1ms", ns(115_000.0)),
        ]);
        let s = render(&r, &BTreeMap::new(), &BTreeMap::new());
        let has = |want: &str| assert!(s.contains(want), "no {want:?} in:\n{s}");
        has("measured from 2027-01-15 08:00:00 UTC to 2027-01-15 08:10:00 UTC");
        has("| bench | memory | sqlite | postgres |\n|---|---|---|---|\n");
        has("| record/0_watchers | 484 ns | 105 µs | 581 µs |\n");
        has("| record/concurrent_16_tasks |  | 40.0k ev/s (400 µs per 16 events) |  |\n");
        assert!(
            !s.contains("| record/1_watchers |"),
            "a row with nothing measured:\n{s}"
        );
        has(
            "`immediate` 181 µs direct, 205 µs through spawn_blocking; `none` 12.0 µs direct, - through spawn_blocking.",
        );
        // The table's separator has a cell per column; the floor of `none` durability has its
        // line too; a target's row gives its measurement, then its bound, then whether it is
        // met. (What the mutation did: one separator cell short; the `none` floor left out; the
        // measured and bound cells swapped; met shown as not met; review of stop 72, BX23 to
        // BX26.)
        has("| sqlite reconcile/5 | 40.0 µs | ≤ 40.0 µs | 1.00x | yes |\n");
        has("59.5 µs a round trip (`SELECT 1`), 70.0 µs a bare one-row insert");
        has("72.0 µs a poll asked and answered; another handle's commit hinted 21.4 ms");
        has("115 µs on a handle polling every 1 ms against 100 µs on one not polling, 1.15x.");
        has(
            "64.0 µs a round trip (`SELECT 1`), 185 µs a bare one-row insert per transaction; \
             postgres `record/0_watchers` 581 µs, 3.14x the insert.",
        );
    }

    /// The p99 beside the passes' table, in the columns' order of backends, each column from
    /// its own field; the scale table's passes that began while recording (the final one not
    /// counted), its p50 and p99, and its RSS growth from the samples after the larger of the
    /// row cap and the sessions.
    /// (What the mutation did: the p99 read from the maximum, the backends sorted by name, the
    /// final pass counted, the p50 read from the p99, the window started at the smaller of the
    /// two; review of stop 68, BR40, BR41, BR43, BR44, BR45.)
    #[test]
    fn prune_and_scale_rows_read_their_own_fields() {
        let prune_row = json!({
            "quiet_p99_ns": 100_000, "pruning_p99_ns": 250_000, "pruning_max_ns": 4_000_000,
            "recordings_during": 300, "passes": 3,
        });
        let prune: BTreeMap<String, (Value, Option<SystemTime>)> =
            ["sqlite", "memory", "redb-bounded"]
                .into_iter()
                .map(|b| {
                    let mut v = prune_row.clone();
                    v["backend"] = json!(b);
                    (b.to_owned(), (v, None))
                })
                .collect();
        let s = render(
            &results(&[("reconcile/5/sqlite", ns(1.0))]),
            &BTreeMap::new(),
            &prune,
        );
        let first = |b: &str| s.find(&format!("| {b} | ")).expect("a prune row");
        assert!(
            first("memory") < first("sqlite") && first("sqlite") < first("redb-bounded"),
            "{s}"
        );
        assert!(
            s.contains("| sqlite | 100 µs | 250 µs | 4.00 ms | 300 | 3 | - |"),
            "{s}"
        );

        let mib = |m: f64| m * 1024.0;
        let run = json!({
            "backend": "sqlite", "events": 1_000_000, "sessions": 100_000, "tasks": 16,
            "events_per_sec": 26_000.0, "p50_ns": 500_000.0, "p99_ns": 2_000_000.0,
            "reconcile_200_ns": 150_000.0, "file_bytes": 10_485_760, "vm_hwm_kib": mib(90.0),
            "rss_every_events": 100_000,
            "rss_kib": [mib(10.0), mib(80.0), mib(80.0), mib(80.0), mib(80.0)],
            "max_rows": 50_000, "prune_passes": 101, "most_events_between_passes": 12_000,
        });
        let mut s = String::new();
        render_scale(
            &mut s,
            &BTreeMap::from([("sqlite".to_owned(), (run.clone(), None))]),
        );
        assert!(
            s.contains(
                "| sqlite | 1.00M / 100k / 16 | 26.0k | 500 µs / 2.00 ms | 150 µs | 100 (at most \
                 12.0k) | 10.0 MiB | 90.0 MiB | every 100k: 10, 80, 80, 80, 80 | +0.00 MiB / 100k | - |"
            ),
            "{s}"
        );
        // A run with no file (memory) and one saved before the passes' gap was shows `-` for
        // each. (What the mutation did: no file shown as 0.0 MiB, no gap as `(at most 0)`;
        // review of stop 72, BX27, BX28.)
        let mut memory = serde_json::Map::new();
        for (k, v) in run.as_object().expect("a run") {
            if k != "file_bytes" && k != "most_events_between_passes" {
                memory.insert(k.clone(), v.clone());
            }
        }
        memory.insert("backend".into(), json!("memory"));
        let mut s = String::new();
        render_scale(
            &mut s,
            &BTreeMap::from([("memory".to_owned(), (Value::Object(memory), None))]),
        );
        assert!(s.contains("| 150 µs | - | - | 90.0 MiB |"), "{s}");
    }

    /// A run saved without its row cap takes the second half of its samples, the middle one of
    /// an odd count included.
    /// (What the mutation did: the odd count's middle sample left out; review of stop 68, BR42.)
    #[test]
    fn rss_growth_without_a_row_cap_takes_the_second_half() {
        assert_eq!(
            rss_growth(&[10.0, 20.0, 30.0, 40.0, 50.0, 50.0, 50.0], 100_000.0, None),
            Some(3.0)
        );
    }

    /// The samples taken before the data stopped growing do not count, those after all do: a
    /// flat steady state grows by 0, one that gains a MiB every sample of 100,000 events by 1
    /// (whatever the first samples did), one sampled every 200,000 by half; fewer than three
    /// steady samples give none.
    #[test]
    fn rss_growth_is_the_slope_once_the_data_stopped_growing() {
        assert_eq!(
            rss_growth(
                &[10.0, 80.0, 80.0, 80.0, 80.0, 80.0],
                100_000.0,
                Some(100_000.0)
            ),
            Some(0.0)
        );
        let near = |got: Option<f64>, want: f64| {
            assert!(got.is_some_and(|g| (g - want).abs() < 1e-9), "{got:?}");
        };
        // The second half of these is flat; from the second sample on they rise.
        let rising = [10.0, 80.0, 81.0, 82.0, 83.0, 84.0, 84.0, 84.0];
        let second_half = [10.0, 80.0, 81.0, 82.0, 83.0, 83.0, 83.0, 83.0];
        near(
            rss_growth(&second_half[..5], 100_000.0, Some(100_000.0)),
            1.0,
        );
        assert!(rss_growth(&rising, 100_000.0, Some(100_000.0)).is_some_and(|g| g > 0.5));
        // A run saved without its row cap: the second half, flat here.
        assert_eq!(rss_growth(&second_half, 100_000.0, None), Some(0.0));
        near(rss_growth(&rising[..5], 200_000.0, Some(200_000.0)), 0.5);
        assert_eq!(
            rss_growth(&[10.0, 80.0, 80.0], 100_000.0, Some(100_000.0)),
            None
        );
        assert_eq!(
            rss_growth(&[10.0, 80.0, 80.0, 80.0], 100_000.0, Some(100_000.0)),
            Some(0.0)
        );
    }
}
