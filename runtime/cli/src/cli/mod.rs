//! The command line: flags with environment fallbacks.

mod crd;
mod delete;
mod edge;
mod fetch;
#[cfg(feature = "cloud")]
mod operator;
mod plugin;
mod run;
mod status;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "perennial", version, about = "Lifelong learning jobs at the edge, with WebAssembly policies")]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, env = "PERENNIAL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Tools for policy plugin authors: check, call and benchmark a plugin.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Runs lifelong learning jobs on this machine, no cluster: manifests in, rounds out.
    Run(run::RunArgs),
    /// Each job's stage, round, samples, deployed model and policies (from a run's state dir).
    Status(status::StatusArgs),
    /// Deletes a job from a run's state dir (a running `perennial run` stops its workers).
    Delete(delete::DeleteArgs),
    /// The edge agent: runs jobs on this node from its own state, and the worker report API.
    Edge(edge::EdgeArgs),
    /// Prints the CustomResourceDefinitions (LifelongLearningJob, Dataset) as YAML.
    Crd,
    /// Downloads a pod's remote inputs (the `storage-initializer` init container).
    Fetch(fetch::FetchArgs),
    /// The Kubernetes operator: reconciles LifelongLearningJobs and their pods.
    #[cfg(feature = "cloud")]
    Operator(Box<operator::OperatorArgs>),
}

pub fn init_tracing(cli: &Cli) {
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // On a terminal `run` shows live lines; its log says only what needs attention.
    let default = if terminal && matches!(cli.command, Command::Run(_)) { "warn" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(perennial_embedded::progress::LogWriter);
    match cli.log_format {
        LogFormat::Text => {
            builder.with_target(false).with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init()
        }
        LogFormat::Json => builder.json().init(),
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Plugin(command) => plugin::run(command).await,
        Command::Edge(args) => edge::run(args).await,
        Command::Run(args) => run::run(args).await,
        Command::Status(args) => status::run(args),
        Command::Delete(args) => delete::run(args),
        Command::Crd => crd::run(),
        Command::Fetch(args) => fetch::run(args).await,
        #[cfg(feature = "cloud")]
        Command::Operator(args) => operator::run(*args).await,
    }
}
