//! `perennial`: lifelong learning jobs at the edge.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Before anything can open a TLS connection (kube, the link, S3 and HTTPS plugin fetches).
    perennial_tls::install_crypto_provider();
    let args = cli::Cli::parse();
    cli::init_tracing(&args);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("perennial: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.downcast_ref::<cli::Exit>().is_some() => {
            let exit = err.downcast_ref::<cli::Exit>().map_or(2, |exit| {
                if !exit.message.is_empty() {
                    eprintln!("perennial: {}", exit.message);
                }
                exit.code
            });
            ExitCode::from(exit)
        }
        Err(err) => {
            // One line that says what was wrong; user errors exit with 2.
            let message = format!("{err:#}");
            eprintln!("perennial: {}", message.split_whitespace().collect::<Vec<_>>().join(" "));
            ExitCode::from(2)
        }
    }
}
