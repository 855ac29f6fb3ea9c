//! `perennial delete`: removes a job from a run's state dir. A `perennial run` going on stops
//! the job's workers within a moment; the job's files (round files, models) stay.

use std::path::PathBuf;

use clap::Args;
use perennial_edge::sqlite::Store;
use perennial_embedded::state;

#[derive(Args)]
pub struct DeleteArgs {
    /// The LifelongLearningJob's name, or `namespace/name`.
    job: String,
    /// Its namespace, when the name has none.
    #[arg(long, short = 'n', default_value = "default")]
    namespace: String,
    /// The state dir of `perennial run`.
    #[arg(long, env = "PERENNIAL_STATE_DIR", default_value = ".perennial")]
    state_dir: PathBuf,
}

pub fn run(args: DeleteArgs) -> anyhow::Result<()> {
    if !args.state_dir.join("control.db").exists() {
        anyhow::bail!("--state-dir {}: no jobs here (no control.db)", args.state_dir.display());
    }
    let key = if args.job.contains('/') { args.job.clone() } else { format!("{}/{}", args.namespace, args.job) };
    let mut control = state::open(&args.state_dir)?;
    if !state::delete_job(&mut control, &key)? {
        anyhow::bail!("no LifelongLearningJob {key} in {}", args.state_dir.display());
    }
    let edge = args.state_dir.join("edge.db");
    if edge.exists() {
        perennial_edge::forget_job(&mut Store::open(&edge)?, &key)?;
    }
    println!("lifelonglearningjob {key} deleted");
    Ok(())
}
