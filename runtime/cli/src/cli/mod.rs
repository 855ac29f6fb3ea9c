//! The command line: flags with environment fallbacks.

#[cfg(any(feature = "cloud", feature = "embedded"))]
mod crd;
#[cfg(feature = "edge-precompiled")]
mod decisions;
#[cfg(feature = "embedded")]
mod delete;
#[cfg(all(test, feature = "cloud", feature = "embedded"))]
mod docs;
#[cfg(feature = "edge-precompiled")]
mod edge;
mod fetch;
#[cfg(feature = "cloud")]
mod operator;
#[cfg(feature = "edge-precompiled")]
mod plugin;
#[cfg(feature = "authoring")]
mod plugin_meta;
#[cfg(feature = "edge-precompiled")]
mod plugin_new;
#[cfg(feature = "edge-precompiled")]
mod plugin_oci;
#[cfg(feature = "edge-precompiled")]
mod plugin_test;
#[cfg(feature = "edge-precompiled")]
mod precompiled;
#[cfg(feature = "embedded")]
mod run;
#[cfg(feature = "embedded")]
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
    /// Tools for policy plugin authors: start a project, check, call and benchmark a plugin, push
    /// it to and pull it from an OCI registry.
    #[cfg(feature = "edge-precompiled")]
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Runs lifelong learning jobs on this machine, no cluster: manifests in, rounds out.
    #[cfg(feature = "embedded")]
    Run(run::RunArgs),
    /// Each job's stage, round, samples, deployed model and policies (from a run's state dir).
    #[cfg(feature = "embedded")]
    Status(status::StatusArgs),
    /// A job's recorded policy decisions, with what each policy saw (from a state dir of
    /// `perennial run` or `perennial edge`).
    #[cfg(feature = "edge-precompiled")]
    Decisions(decisions::DecisionsArgs),
    /// Deletes a job from a run's state dir (a running `perennial run` stops its workers).
    #[cfg(feature = "embedded")]
    Delete(delete::DeleteArgs),
    /// The edge agent: runs jobs on this node from its own state, and the worker report API.
    #[cfg(feature = "edge-precompiled")]
    Edge(edge::EdgeArgs),
    /// Prints the CustomResourceDefinitions (LifelongLearningJob, Dataset) as YAML.
    #[cfg(any(feature = "cloud", feature = "embedded"))]
    Crd,
    /// Downloads a pod's remote inputs (the `storage-initializer` init container).
    Fetch(fetch::FetchArgs),
    /// Started by `perennial run`: kills the worker process groups it is told of once the run
    /// ends, however it ends (not for use by hand).
    #[cfg(feature = "embedded")]
    #[command(hide = true)]
    Reap,
    /// The Kubernetes operator: reconciles LifelongLearningJobs and their pods.
    #[cfg(feature = "cloud")]
    Operator(Box<operator::OperatorArgs>),
}

impl Command {
    /// A command that only prints what it reads (and holds no sockets or children), so that
    /// `| head` may end it.
    fn only_prints(&self) -> bool {
        match self {
            #[cfg(feature = "embedded")]
            Command::Status(_) => true,
            #[cfg(feature = "edge-precompiled")]
            Command::Decisions(_) | Command::Plugin(plugin::PluginCommand::Platform) => true,
            #[cfg(any(feature = "cloud", feature = "embedded"))]
            Command::Crd => true,
            _ => false,
        }
    }
}

/// A closed stdout (`perennial status | head`) ends the process as it ends `ls`, instead of a
/// panic in `println!`: the default action of SIGPIPE, which Rust's runtime sets to ignore.
fn end_quietly_on_closed_stdout() {
    // SAFETY: setting a signal's disposition to the default has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Log lines go to stderr, around `perennial run`'s live lines when it shows them.
#[cfg(feature = "embedded")]
fn log_writer() -> perennial_embedded::progress::LogWriter {
    perennial_embedded::progress::LogWriter
}

#[cfg(not(feature = "embedded"))]
fn log_writer() -> fn() -> std::io::Stderr {
    std::io::stderr
}

pub fn init_tracing(cli: &Cli) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // On a terminal `run` shows live lines; its log says only what needs attention.
    #[cfg(feature = "embedded")]
    let running = matches!(cli.command, Command::Run(_));
    #[cfg(not(feature = "embedded"))]
    let running = false;
    let default = if terminal && running { "warn" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // The WebSocket library's trace lines print each frame of the link, whose desired state
    // carries the jobs' registry logins: never shown, whatever RUST_LOG says (a filter after
    // RUST_LOG's, so that no more specific target, e.g. `tungstenite::protocol=trace`, lifts it).
    let mut no_frames = tracing_subscriber::filter::filter_fn(|meta| {
        let websocket = meta.target().starts_with("tungstenite") || meta.target().starts_with("tokio_tungstenite");
        !websocket || *meta.level() <= tracing::Level::DEBUG
    });
    // RUST_LOG's most verbose level stays the process's: the `log` records of the libraries
    // (Cranelift's trace lines, a flood in a compile) are cut where they are made, not built
    // and dropped.
    if let Some(hint) = tracing_subscriber::Layer::<tracing_subscriber::Registry>::max_level_hint(&filter) {
        no_frames = no_frames.with_max_level_hint(hint);
    }
    let filter = filter.and(no_frames);
    let registry = tracing_subscriber::registry();
    match cli.log_format {
        LogFormat::Text => {
            let layer = tracing_subscriber::fmt::layer()
                .with_writer(log_writer())
                .with_target(false)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
            registry.with(layer.with_filter(filter)).init()
        }
        LogFormat::Json => {
            let layer = tracing_subscriber::fmt::layer().json().with_writer(log_writer());
            registry.with(layer.with_filter(filter)).init()
        }
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.command.only_prints() {
        end_quietly_on_closed_stdout();
    }
    match cli.command {
        #[cfg(feature = "edge-precompiled")]
        Command::Plugin(command) => plugin::run(command).await,
        #[cfg(feature = "edge-precompiled")]
        Command::Edge(args) => edge::run(args).await,
        #[cfg(feature = "embedded")]
        Command::Run(args) => run::run(args).await,
        #[cfg(feature = "embedded")]
        Command::Status(args) => status::run(args),
        #[cfg(feature = "embedded")]
        Command::Delete(args) => delete::run(args),
        #[cfg(feature = "edge-precompiled")]
        Command::Decisions(args) => decisions::run(args),
        #[cfg(any(feature = "cloud", feature = "embedded"))]
        Command::Crd => crd::run(),
        #[cfg(feature = "embedded")]
        Command::Reap => {
            perennial_workers::reaper::serve(std::io::stdin().lock());
            Ok(())
        }
        Command::Fetch(args) => fetch::run(args).await,
        #[cfg(feature = "cloud")]
        Command::Operator(args) => operator::run(*args).await,
    }
}

/// Ends the process with `code`, saying `message` (if any) on stderr: a subcommand whose exit
/// code means more than success or a user error (`plugin replay`: 1 when it disagreed).
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: String,
}

impl Exit {
    /// The code alone: the subcommand has said what it had to on stdout.
    pub fn quiet(code: u8) -> Self {
        Exit { code, message: String::new() }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}
