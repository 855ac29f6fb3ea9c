//! `perennial edge`: the edge agent on one node, standalone. It runs the jobs listed in a file
//! from its own SQLite state, and serves the worker report API. (The link to the control plane
//! comes with the cloud-edge link; until then, reports wait in the state's outbox.)

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use perennial::edge::agent::{self, JobConfig, LoopSettings};
use perennial::edge::{self, IndexFile, LocalFile, S3Index, worker_api};
use perennial::policy::PolicyHost;
use perennial::storage::S3Credentials;
use perennial::store::Store;

#[derive(Args)]
pub struct EdgeArgs {
    /// Where the agent keeps its state (SQLite) and compile cache.
    #[arg(long, env = "PERENNIAL_STATE_DIR", default_value = "/var/lib/perennial")]
    state_dir: PathBuf,
    /// A JSON file with the jobs to run: a list of {name, uid, spec, splitter?, trigger, selector?}.
    #[arg(long, value_name = "FILE")]
    jobs: PathBuf,
    /// Port of the worker report API (Sedna's `BIND_PORT`).
    #[arg(long, env = "BIND_PORT", default_value_t = 9100)]
    bind_port: u16,
    /// Address of the worker report API.
    #[arg(long, env = "BIND_ADDRESS", default_value = "0.0.0.0")]
    bind_address: std::net::IpAddr,
    /// How often to look at a local dataset index when no change notification arrives, in ms.
    #[arg(long, default_value_t = 2000)]
    poll_ms: u64,
    /// How often to look at a dataset index on S3, in ms.
    #[arg(long, default_value_t = 5000)]
    s3_poll_ms: u64,
}

pub async fn run(args: EdgeArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("--state-dir {}: cannot create it", args.state_dir.display()))?;
    let text = std::fs::read_to_string(&args.jobs).with_context(|| format!("--jobs {}", args.jobs.display()))?;
    let jobs: Vec<JobConfig> =
        serde_json::from_str(&text).with_context(|| format!("--jobs {}", args.jobs.display()))?;
    let mut store = Store::open(&args.state_dir.join("edge.db"))?;
    for job in &jobs {
        edge::register_job(&mut store, &job.name, &job.uid, &job.spec)?;
    }
    let store = Arc::new(Mutex::new(store));
    let host = PolicyHost::new(Some(args.state_dir.join("policy-cache")), None)?;
    let stop = Arc::new(AtomicBool::new(false));
    let settings = LoopSettings { poll: Duration::from_millis(args.poll_ms.max(10)), ..LoopSettings::default() };
    let mut runners = Vec::new();
    for job in jobs {
        let policies = agent::load_policies(&host, &job).await.with_context(|| format!("job {}", job.name))?;
        let s3 = S3Credentials::from_env();
        let output = edge::output::output_operator(&job.spec.output_dir, s3.as_ref())
            .with_context(|| format!("job {}: spec.outputDir", job.name))?;
        let output = opendal::blocking::Operator::new(output)?;
        let (index, settings): (Box<dyn IndexFile + Send>, _) = if job.spec.dataset_url.starts_with("s3://") {
            let index = S3Index::open(&job.spec.dataset_url, s3.as_ref())
                .with_context(|| format!("job {}: the dataset index", job.name))?;
            (Box::new(index), LoopSettings { poll: Duration::from_millis(args.s3_poll_ms.max(100)), ..settings })
        } else {
            (Box::new(LocalFile { path: job.spec.dataset_url.clone().into() }), settings)
        };
        // Loading proved the config; the instances come back when the job next runs.
        policies.release();
        let dataset_dir = std::path::Path::new(&job.spec.dataset_url).parent().map(|p| p.display().to_string());
        let roots = [Some(job.spec.output_dir.clone()), dataset_dir].into_iter().flatten().collect();
        let read_model = agent::model_reader(tokio::runtime::Handle::current(), s3, roots);
        runners.push(agent::JobRunner { job, policies, index, output, read_model, settings });
    }
    release_freed_memory();
    let jobs_thread = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::Builder::new()
            .name("jobs".into())
            .spawn(move || agent::run_jobs(&store, &mut runners, &stop, agent::Wakes::new(), &|| {}, None))?
    };
    release_freed_memory();
    let address = SocketAddr::new(args.bind_address, args.bind_port);
    let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("worker API on {address}"))?;
    tracing::info!("worker report API on {}", listener.local_addr()?);
    let api = worker_api::router(store.clone(), Arc::new(|| {}));
    let shutdown = async {
        // Ctrl-C, or SIGTERM from systemd or the kubelet.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(term) => { term.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("stopping");
    };
    axum::serve(listener, api).with_graceful_shutdown(shutdown).await?;
    stop.store(true, Ordering::Relaxed);
    let _ = jobs_thread.join();
    Ok(())
}

/// Hands memory freed after start-up (compiling policies) back to the system, so that a small
/// edge node sees the agent's steady size.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
