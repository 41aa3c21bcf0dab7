//! The `awareness` binary: see the `awareness_cli` library for what each command does.

#[tokio::main]
async fn main() {
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    let code = awareness_cli::run(std::env::args_os(), &mut out, &mut err).await;
    drop(out);
    drop(err);
    std::process::exit(code);
}
