//! The `awareness` binary: see the `awareness_cli` library for what each command does.

#[tokio::main]
async fn main() {
    // The libraries' warnings (best-effort failures they carry on after) go to stderr.
    let level = match awareness_cli::log::level_from(
        std::env::var_os(awareness_cli::log::LOG_ENV).as_deref(),
    ) {
        Ok(level) => level,
        Err(e) => {
            eprintln!("awareness: {e}");
            std::process::exit(awareness_cli::EXIT_USAGE);
        }
    };
    awareness_cli::log::install(level);
    // Unlocked handles, which lock per write. With stderr locked for the whole run, a warning
    // logged on another thread (the monitor's task) would wait for the run to end, and the run
    // would wait for that thread: neither would.
    let code = awareness_cli::run(
        std::env::args_os(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    )
    .await;
    std::process::exit(code);
}
