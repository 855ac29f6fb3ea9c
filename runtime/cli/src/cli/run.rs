//! `perennial run`: whole lifelong learning jobs on this machine (the embedded mode).

use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use perennial_embedded::{self as embedded, RunEnd, RunOptions};
use perennial_lifecycle::Settings;

#[derive(Args)]
pub struct RunArgs {
    /// Manifest files (several YAML documents each) or folders of them: Datasets,
    /// LifelongLearningJobs, and Pods to run beside them (e.g. a data generator). None: run the
    /// jobs already in the state dir.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Where the run keeps its state (SQLite), logs, and what relative paths in the manifests
    /// point to (datasets, output dirs).
    #[arg(long, env = "PERENNIAL_STATE_DIR", default_value = ".perennial")]
    state_dir: PathBuf,
    /// The compile cache of policies, shared with `perennial plugin` and `edge` (default
    /// `$XDG_CACHE_HOME/perennial/policies` or `~/.cache/perennial/policies`).
    #[arg(long, env = "PERENNIAL_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Exit 0 once every job has completed this many rounds.
    #[arg(long, value_name = "N")]
    rounds: Option<u64>,
    /// Address of the worker report API (the workers' `LC_SERVER`).
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: IpAddr,
    /// Port of the worker report API; 0 picks a free one.
    #[arg(long, env = "BIND_PORT", default_value_t = 0)]
    bind_port: u16,
    /// Sedna's `KB_SERVER`, given to train and eval workers.
    #[arg(long, env = "KB_SERVER", default_value = "http://127.0.0.1:9020")]
    kb_server: String,
    /// How often to look at a dataset index when no change notification arrives, in ms.
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    /// First wait before a failed round goes back to Train (doubling up to 360 s), in seconds.
    #[arg(long, default_value_t = 10)]
    retry_backoff_secs: u64,
    /// Restarts of a stage's worker beyond which the stage fails.
    #[arg(long, default_value_t = 3)]
    restart_limit: u32,
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    // Jobs decide while policies compile: a compile gets one low-priority thread, never a core
    // the decisions need.
    perennial_policy::set_compile_mode(perennial_policy::CompileMode::Background);
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            perennial_link::stop_signal::stop_signal().await;
            tracing::info!("stopping: the workers are stopped; `perennial run` again resumes");
            stop.store(true, Ordering::Relaxed);
        });
    }
    let backoff = Duration::from_secs(args.retry_backoff_secs.max(1));
    let options = RunOptions {
        paths: args.paths,
        state_dir: args.state_dir,
        cache_dir: args.cache_dir,
        rounds: args.rounds,
        bind: SocketAddr::new(args.bind_address, args.bind_port),
        kb_server: args.kb_server,
        poll: Duration::from_millis(args.poll_ms.max(10)),
        terminal: std::io::stderr().is_terminal(),
        settings: Settings {
            backoff_base: backoff,
            backoff_max: Duration::from_secs(360).max(backoff),
            restart_limit: args.restart_limit,
            ..Settings::default()
        },
        reaper: std::env::current_exe().ok(),
        compiler: std::env::current_exe().ok(),
    };
    match embedded::run(options, stop).await? {
        RunEnd::RoundsDone => tracing::info!("done: every job completed the rounds asked for"),
        RunEnd::Stopped => {}
    }
    Ok(())
}
