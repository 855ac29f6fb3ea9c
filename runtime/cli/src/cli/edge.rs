//! `perennial edge`: the edge agent on one node. It runs its jobs from its own SQLite state,
//! serves the worker report API, and, given a cloud URL, keeps the link to the operator: the
//! node's jobs come down as its desired state, reports go up from the outbox. While the cloud
//! is unreachable it goes on from its state (samples are split, rounds start, reports queue).
//! Without a cloud URL it runs the jobs listed in a file (standalone).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use perennial_edge::agent::{self, JobConfig, LoopSettings, Wake};
use perennial_edge::link_state::{desired_jobs, node_job};
use perennial_edge::model_copy::{ModelCopier, model_copier};
use perennial_edge::sqlite::{self, Store};
use perennial_edge::{self as edge, IndexFile, LocalFile, S3Index, worker_api};
use perennial_link::Changes;
use perennial_link::artifacts::Downloads;
use perennial_link::edge_client::{self, ClientSettings, LinkEvents, TokenSource};
use perennial_link::messages::PolicyPlatform;
use perennial_link::socket::client_tls;
use perennial_policy::PolicyHost;
use perennial_storage::S3Credentials;
use tokio::sync::{Notify, mpsc as async_mpsc, watch};

#[derive(Args)]
pub struct EdgeArgs {
    /// Where the agent keeps its state (SQLite).
    #[arg(long, env = "PERENNIAL_STATE_DIR", default_value = "/var/lib/perennial")]
    state_dir: PathBuf,
    /// The compile cache of policies, shared with `perennial plugin` and `run` (default
    /// `$XDG_CACHE_HOME/perennial/policies` or `~/.cache/perennial/policies`).
    #[arg(long, env = "PERENNIAL_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// The ed25519 public key (PEM) whose signature a precompiled policy (`.pcwasm`, made by
    /// `perennial plugin compile`) needs; the compiler-free agent runs nothing else.
    #[arg(long, value_name = "FILE", env = "PERENNIAL_TRUST_KEY")]
    trust_key: Option<PathBuf>,
    /// The operator's link, `wss://host:port/v1/link`: the node's jobs come from it.
    #[arg(long, env = "PERENNIAL_CLOUD_URL", required_unless_present = "jobs")]
    cloud_url: Option<String>,
    /// The name the link's certificate must carry, when `--cloud-url`'s host is not that name
    /// (an IP address, a NodePort, a tunnel); default: the URL's host.
    #[arg(long, env = "PERENNIAL_CLOUD_SERVER_NAME", requires = "cloud_url")]
    cloud_server_name: Option<String>,
    /// A file holding this node's bearer token for the link, read again on every (re)connect:
    /// in Kubernetes a projected ServiceAccount token (the kubelet rotates it); on a systemd
    /// node its static token. Or a folder holding a file named after each node.
    #[arg(long, env = "PERENNIAL_TOKEN_FILE", requires = "cloud_url")]
    token_file: Option<PathBuf>,
    /// The CA certificate (PEM) that signed the operator's link certificate.
    #[arg(long, env = "PERENNIAL_CA_FILE", requires = "cloud_url")]
    ca_file: Option<PathBuf>,
    /// This node's name, as the operator knows it (Sedna's `NODENAME`); default: the host name.
    #[arg(long, env = "NODENAME")]
    node_name: Option<String>,
    /// Standalone: a JSON file with the jobs to run: a list of {name, uid, spec, splitter?,
    /// trigger, selector?}.
    #[arg(long, value_name = "FILE", conflicts_with = "cloud_url")]
    jobs: Option<PathBuf>,
    /// Port of the worker report API (Sedna's `BIND_PORT`).
    #[arg(long, env = "BIND_PORT", default_value_t = 9100)]
    bind_port: u16,
    /// Address of the worker report API. Workers run on the host network (Sedna's pods) and
    /// reach it on the loopback; `0.0.0.0` opens it to the network.
    #[arg(long, env = "BIND_ADDRESS", default_value = "127.0.0.1")]
    bind_address: std::net::IpAddr,
    /// Where the host's filesystem is mounted (Sedna's `ROOTFS_MOUNT_DIR`): the jobs' local
    /// paths are host paths, read and written under this prefix (a DaemonSet mounts `/` here).
    #[arg(long, env = "ROOTFS_MOUNT_DIR")]
    rootfs_mount_dir: Option<PathBuf>,
    /// How often to look at a local dataset index when no change notification arrives, in ms.
    #[arg(long, default_value_t = 2000)]
    poll_ms: u64,
    /// How often to look at a dataset index on S3, in ms.
    #[arg(long, default_value_t = 5000)]
    s3_poll_ms: u64,
}

/// How this node runs a job (from the flags).
#[derive(Clone)]
struct RunnerSettings {
    rootfs: Option<PathBuf>,
    poll: Duration,
    s3_poll: Duration,
}

impl RunnerSettings {
    /// A host path as this process sees it.
    fn host_path(&self, path: &str) -> String {
        host_path(self.rootfs.as_deref(), path)
    }
}

/// A host path as a process that sees the host's filesystem under `rootfs` sees it.
pub(crate) fn host_path(rootfs: Option<&Path>, path: &str) -> String {
    match rootfs {
        Some(root) if path.starts_with('/') => format!("{}{path}", root.display().to_string().trim_end_matches('/')),
        _ => path.to_owned(),
    }
}

/// The most a `--jobs` file may be: a list of job configs, not data.
const MAX_JOBS_FILE_BYTES: u64 = 16 << 20;

/// The `--jobs` file's text, bounded.
fn read_jobs_file(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).with_context(|| format!("--jobs {}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_JOBS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("--jobs {}", path.display()))?;
    if text.len() as u64 > MAX_JOBS_FILE_BYTES {
        anyhow::bail!("--jobs {}: over {MAX_JOBS_FILE_BYTES} bytes: a list of jobs is far smaller", path.display());
    }
    Ok(text)
}

pub async fn run(args: EdgeArgs) -> anyhow::Result<()> {
    // Jobs decide while policies compile: a compile gets one low-priority thread, never a core
    // the decisions need.
    perennial_policy::set_compile_mode(perennial_policy::CompileMode::Background);
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("--state-dir {}: cannot create it", args.state_dir.display()))?;
    let mut link = args.cloud_url.as_ref().map(|url| link_settings(url, &args)).transpose()?;
    let _lock = perennial_edge::state_lock::lock(&args.state_dir, "perennial edge")?;
    let mut store = Store::open(&args.state_dir.join("edge.db"))?;
    store.counts_in_outbox = link.is_some();
    let configs: Vec<JobConfig> = match &args.jobs {
        Some(path) => {
            let text = read_jobs_file(path)?;
            let jobs: Vec<JobConfig> =
                serde_json::from_str(&text).with_context(|| format!("--jobs {}", path.display()))?;
            if let Some(job) = jobs.iter().find(|job| !job.registry_auth.is_empty()) {
                anyhow::bail!(
                    "--jobs {}: job {}: registryAuth is the operator's (from a job's imagePullSecrets), not a job \
                     file's: a node without a cloud pulls with its own docker config (DOCKER_CONFIG)",
                    path.display(),
                    job.name
                );
            }
            // Standalone, nothing else would ever bring it a job.
            if jobs.is_empty() && link.is_none() {
                anyhow::bail!("--jobs {}: the list holds no job (and no --cloud-url would bring one)", path.display());
            }
            for job in &jobs {
                edge::register_job(&mut store, &job.name, &job.uid, &job.spec)?;
            }
            jobs
        }
        // The jobs of the last desired state: the node works before (and without) the cloud.
        None => desired_jobs(&store)?.into_iter().map(|job| job.config).collect(),
    };
    let store = Arc::new(Mutex::new(store));
    let host = PolicyHost::with_shared_cache(args.cache_dir.clone(), None)?;
    #[cfg(feature = "edge")]
    if let Ok(exe) = std::env::current_exe() {
        host.compile_in_child_process(exe);
    }
    if let Some(path) = &args.trust_key {
        let key = perennial_policy::signing::TrustedKey::from_file(path)
            .map_err(|err| anyhow::anyhow!("--trust-key {err}"))?;
        tracing::info!("precompiled policies signed by key {} are trusted", key.id());
        host.trust(key);
    }
    // A node that trusts a key (or cannot compile) runs what the operator compiles for it: it
    // says its platform when it connects, and fetches the signed artifacts over the link.
    let link_up = Arc::new(AtomicBool::new(false));
    if let Some(link) = link.as_mut()
        && (args.trust_key.is_some() || !perennial_policy::HAS_COMPILER)
    {
        let platform = perennial_policy::platform::this_node();
        link.policy_platform = Some(PolicyPlatform {
            platform: platform.to_owned(),
            fingerprint: perennial_policy::platform::fingerprint(platform),
            compiles: perennial_policy::HAS_COMPILER,
        });
        let dir = args.state_dir.join("artifacts");
        let downloads = Downloads::new(dir.clone()).with_context(|| format!("{}: cannot create it", dir.display()))?;
        host.fetch_artifacts_with(Arc::new(LinkArtifacts { downloads: downloads.clone(), link_up: link_up.clone() }));
        link.downloads = Some(downloads);
    }
    let settings = RunnerSettings {
        rootfs: args.rootfs_mount_dir.clone(),
        poll: Duration::from_millis(args.poll_ms.max(10)),
        s3_poll: Duration::from_millis(args.s3_poll_ms.max(100)),
    };
    let mut runners = Vec::new();
    let mut running = Running::default();
    let mut waiting = Vec::new();
    let mut refused = Vec::new();
    // Why each job that could not start did not, as said (a retry says only a new reason).
    let mut said = std::collections::BTreeMap::new();
    for job in configs {
        // Before any of its writes: what an interrupted one left (a kill, a full disk).
        edge::output::clear_temporary(&settings.host_path(&job.spec.output_dir));
        match runner(&host, job.clone(), &settings).await {
            Ok(runner) => {
                agent::record_serving(&mut sqlite::lock(&store), &runner);
                running.by_name.insert(job.name.clone(), (runners.len(), job));
                runners.push(runner);
            }
            // One job's bad policy stops that job, never the others: said, and on its status.
            Err(err) => {
                tracing::error!("job {} cannot run on this node yet: {err:#}", job.name);
                said.insert(job.name.clone(), format!("{err:#}"));
                record_refused(&store, &job, &err);
                if link.is_some() && may_pass(&err) || link.is_none() && fetched_from_afar(&err) {
                    waiting.push(job);
                } else if link.is_none() {
                    refused.push(format!("{err:#}"));
                }
            }
        }
    }
    // Standalone, nothing else could ever start them: an agent with no job that can run is a
    // mistake to say at once, not a process idling for ever.
    if link.is_none() && runners.is_empty() && waiting.is_empty() && !refused.is_empty() {
        anyhow::bail!("no job of --jobs can run: {}", refused.join("; "));
    }
    running.next_index = runners.len();
    perennial_policy::release_freed_memory();
    let outbox = Arc::new(Notify::new());
    let stop = Arc::new(AtomicBool::new(false));
    let wakes = agent::Wakes::new();
    let (wake, report_wake) = (wakes.sender(), wakes.sender());
    let jobs_thread = {
        let (store, stop, outbox) = (store.clone(), stop.clone(), outbox.clone());
        let swapper = agent::Swapper::new(host.clone(), tokio::runtime::Handle::current());
        std::thread::Builder::new().name("jobs".into()).spawn(move || {
            agent::run_jobs(&store, &mut runners, &stop, wakes, &|| outbox.notify_one(), Some(&swapper))
        })?
    };
    perennial_policy::release_freed_memory();
    let (stop_link, link_stopped) = watch::channel(false);
    let waiting: std::collections::BTreeMap<_, _> = waiting.into_iter().map(|job| (job.name.clone(), job)).collect();
    let jobs = Jobs { running, waiting, said };
    let (changes, changed) = async_mpsc::unbounded_channel();
    // Standalone, no change ever comes (this sender, kept, sends none): the jobs whose policy a
    // server did not give yet are tried again until it does.
    let _no_changes = changes.clone();
    if link.is_some() || !jobs.waiting.is_empty() {
        tokio::spawn(follow_desired(changed, jobs, wake, host, settings, store.clone()));
    }
    let link_task = link.map(|link| {
        tokio::spawn(queue_status_changes(store.clone(), outbox.clone()));
        tokio::spawn(edge_client::run(
            link,
            store.clone(),
            outbox.clone(),
            Arc::new(DesiredJobs { changes, link_up }),
            link_stopped,
        ))
    });
    let address = SocketAddr::new(args.bind_address, args.bind_port);
    let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("worker API on {address}"))?;
    tracing::info!("worker report API on {}", listener.local_addr()?);
    // Linked, a worker's name arrives with the desired state, which may come after the worker's
    // report (the operator restarted): held for the link to name it.
    let hold = args.cloud_url.is_some().then_some(worker_api::HOLD_UNKNOWN_WORKERS);
    // The report goes out at once; a train result moved its job on to the eval step, done now.
    let on_report = move |moved: Option<&str>| {
        outbox.notify_one();
        if let Some(job) = moved {
            let _ = report_wake.send(Wake::JobNamed(job.to_owned()));
        }
    };
    let api = worker_api::router(store.clone(), Arc::new(on_report), hold);
    perennial_edge::serve::serve(listener, api, shutdown_signal()).await;
    stop.store(true, Ordering::Relaxed);
    stop_link.send_replace(true);
    if let Some(task) = link_task {
        let _ = task.await;
    }
    let _ = jobs_thread.join();
    Ok(())
}

/// Ctrl-C, or SIGTERM from systemd or the kubelet.
async fn shutdown_signal() {
    perennial_link::stop_signal::stop_signal().await;
    tracing::info!("stopping");
}

/// The link's settings from the flags; every error names its flag or file.
fn link_settings(url: &str, args: &EdgeArgs) -> anyhow::Result<ClientSettings> {
    if !url.starts_with("wss://") {
        anyhow::bail!("--cloud-url {url}: the link is wss:// only (TLS)");
    }
    let node = match &args.node_name {
        Some(node) if !node.trim().is_empty() => node.trim().to_owned(),
        _ => host_name().context("--node-name: not given (NODENAME), and the host name cannot be read")?,
    };
    let token_file = args.token_file.as_deref().context("--token-file: the link needs this node's token")?;
    // A folder (a Secret of every node's token, mounted by the DaemonSet): the node's own file.
    let token_file = if token_file.is_dir() { token_file.join(&node) } else { token_file.to_owned() };
    // Read now to fail fast on a wrong path; read again on every connect.
    let meta = std::fs::metadata(&token_file).with_context(|| format!("--token-file {}", token_file.display()))?;
    if meta.len() == 0 {
        anyhow::bail!("--token-file {}: the file is empty", token_file.display());
    }
    let ca_file = args.ca_file.as_deref().context("--ca-file: the link needs the CA of the operator's certificate")?;
    let ca = std::fs::read(ca_file).with_context(|| format!("--ca-file {}", ca_file.display()))?;
    let tls = client_tls(&ca).with_context(|| format!("--ca-file {}", ca_file.display()))?;
    Ok(ClientSettings {
        url: url.to_owned(),
        server_name: args.cloud_server_name.clone(),
        token: TokenSource::File(token_file),
        tls,
        node,
        min_backoff: Duration::from_millis(500),
        max_backoff: Duration::from_secs(60),
        policy_platform: None,
        downloads: None,
    })
}

fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

/// Loads a job's policies and opens its index and output (under the root prefix).
async fn runner(host: &PolicyHost, job: JobConfig, settings: &RunnerSettings) -> anyhow::Result<agent::JobRunner> {
    let policies = agent::load_policies(host, &job).await.with_context(|| format!("job {}", job.name))?;
    let s3 = S3Credentials::from_env();
    let output_dir = settings.host_path(&job.spec.output_dir);
    let output = edge::output::output_operator(&output_dir, s3.as_ref())
        .with_context(|| format!("job {}: spec.outputDir", job.name))?;
    let output = opendal::blocking::Operator::new(output)?;
    let poll = LoopSettings { poll: settings.poll, ..LoopSettings::default() };
    let (index, loop_settings): (Box<dyn IndexFile + Send>, _) = if job.spec.dataset_url.starts_with("s3://") {
        let index = S3Index::open(&job.spec.dataset_url, s3.as_ref())
            .with_context(|| format!("job {}: the dataset index", job.name))?;
        (Box::new(index), LoopSettings { poll: settings.s3_poll, ..poll })
    } else {
        (Box::new(LocalFile { path: settings.host_path(&job.spec.dataset_url).into() }), poll)
    };
    // Loading proved the config; the instances come back when the job next runs.
    policies.release();
    let dataset_dir = Path::new(&job.spec.dataset_url).parent().map(|p| p.display().to_string());
    let roots = [Some(job.spec.output_dir.clone()), dataset_dir]
        .into_iter()
        .flatten()
        .map(|root| settings.host_path(&root))
        .collect();
    let copy = model_copier(tokio::runtime::Handle::current(), s3, output_dir, roots);
    // Workers report paths as the host has them, under the root prefix here.
    let paths = settings.clone();
    let copy_model: ModelCopier = Box::new(move |url: &str, dest: &str| copy(&paths.host_path(url), dest));
    Ok(agent::JobRunner { job, policies, index, output, copy_model, settings: loop_settings })
}

/// The jobs the loop runs, by name: their index in it and their config.
#[derive(Default)]
struct Running {
    by_name: HashMap<String, (usize, JobConfig)>,
    next_index: usize,
}

/// Hands each committed desired state to [`follow_desired`], in order.
struct DesiredJobs {
    changes: async_mpsc::UnboundedSender<Changes>,
    link_up: Arc<AtomicBool>,
}

impl LinkEvents for DesiredJobs {
    fn desired_applied(&self, changes: &Changes) {
        let _ = self.changes.send(changes.clone());
    }

    fn connected(&self, up: bool) {
        self.link_up.store(up, Ordering::Relaxed);
        if !up {
            tracing::info!("working from the local state until the link is back");
        }
    }
}

/// The node's jobs: those the loop runs, and those that could not start yet (their policies
/// did not load: the operator still compiles them, the link was down, a fetch failed).
struct Jobs {
    running: Running,
    waiting: std::collections::BTreeMap<String, JobConfig>,
    /// Why each job that could not start did not, as last said (once per reason).
    said: std::collections::BTreeMap<String, String>,
}

/// How often a job that could not start is tried again.
const WAITING_RETRY: Duration = Duration::from_secs(15);

/// Brings the job loop to each desired state, one after the other: new jobs start, changed ones
/// swap their policies between two calls, re-staged ones are looked at now, removed ones stop.
/// A job that cannot start yet is tried again with its next change, or every [`WAITING_RETRY`].
/// (The edge store already holds the state: it was committed before the `desiredAck`.)
async fn follow_desired(
    mut changes: async_mpsc::UnboundedReceiver<Changes>,
    mut jobs: Jobs,
    wake: mpsc::Sender<Wake>,
    host: PolicyHost,
    settings: RunnerSettings,
    store: Arc<Mutex<Store>>,
) {
    // The first retry a period after the start's own try.
    let mut retry = tokio::time::interval_at(tokio::time::Instant::now() + WAITING_RETRY, WAITING_RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let placed: Vec<(String, JobConfig)> = tokio::select! {
            change = changes.recv() => {
                let Some(change) = change else { return };
                for key in &change.removed_jobs {
                    jobs.waiting.remove(key);
                    if let Some((index, _)) = jobs.running.by_name.remove(key) {
                        tracing::info!(job = key, "the job left this node");
                        let _ = wake.send(Wake::Remove(index));
                    }
                }
                // A desired state comes on each connect too: the jobs waiting for the link (an
                // artifact to fetch) are tried again with it.
                let mut placed: Vec<(String, JobConfig)> = std::mem::take(&mut jobs.waiting).into_iter().collect();
                for (key, object) in &change.jobs {
                    if let Ok(job) = node_job(key, object) {
                        placed.retain(|(waiting, _)| waiting != key);
                        placed.push((key.clone(), job.config));
                    }
                }
                placed
            }
            _ = retry.tick(), if !jobs.waiting.is_empty() => std::mem::take(&mut jobs.waiting).into_iter().collect(),
        };
        for (key, config) in placed {
            place(&mut jobs, key, config, &wake, &host, &settings, &store).await;
        }
    }
}

/// Brings one job to `config`: a swap in place, a start, or a restart on other files.
async fn place(
    jobs: &mut Jobs,
    key: String,
    config: JobConfig,
    wake: &mpsc::Sender<Wake>,
    host: &PolicyHost,
    settings: &RunnerSettings,
    store: &Arc<Mutex<Store>>,
) {
    let running = &mut jobs.running;
    match running.by_name.get_mut(&key) {
        // Policies and trainProb change in place; the rest (the index, the output) needs the job
        // opened again, below.
        Some((index, current)) if current.uid == config.uid && current.spec.same_files(&config.spec) => {
            if *current != config {
                let _ = wake.send(Wake::Swap(*index, Box::new(config.clone())));
                *current = config;
            }
            let _ = wake.send(Wake::Job(*index));
        }
        known => {
            if let Some((index, _)) = known {
                // Another uid (a new job: the old one's state was dropped), or the same job on
                // other files: the old runner stops, a new one starts.
                let _ = wake.send(Wake::Remove(*index));
            }
            running.by_name.remove(&key);
            match runner(host, config.clone(), settings).await {
                Ok(runner) => {
                    tracing::info!(job = key, "the job came to this node");
                    // The jobs thread may hold the store a while: not on this runtime's thread.
                    tokio::task::block_in_place(|| agent::record_serving(&mut sqlite::lock(store), &runner));
                    let index = running.next_index;
                    running.next_index += 1;
                    jobs.said.remove(&key);
                    running.by_name.insert(key, (index, config));
                    let _ = wake.send(Wake::Add(Box::new(runner)));
                    // Compiling the policies used memory the idle job does not need.
                    perennial_policy::release_freed_memory();
                }
                Err(err) => {
                    // Said once per job and reason, not at every retry.
                    let reason = format!("{err:#}");
                    if jobs.said.insert(key.clone(), reason).as_deref() != Some(&format!("{err:#}")) {
                        tracing::warn!(job = key, "the job cannot run on this node yet: {err:#}");
                    }
                    tokio::task::block_in_place(|| record_refused(store, &config, &err));
                    if may_pass(&err) {
                        jobs.waiting.insert(key, config);
                    }
                }
            }
        }
    }
}

/// Whether a job that could not start may start later as it is. A policy that did not compile,
/// verify or start needs a change to be fixed (which comes as one); a fetch may pass by itself
/// (the operator still compiling, the link down, a server away), and so may the rest (an index
/// on S3 out of reach).
fn may_pass(err: &anyhow::Error) -> bool {
    err.downcast_ref::<agent::PolicyLoadError>()
        .is_none_or(|refused| refused.error.step == perennial_policy::Step::Fetch)
}

/// Whether a standalone job that could not start is tried again: its policy is fetched from a
/// server (a registry, an https:// or s3:// store) that may be up later, as on a node whose
/// network comes up after the agent. The rest needs an edit of the jobs file and a restart.
fn fetched_from_afar(err: &anyhow::Error) -> bool {
    err.downcast_ref::<agent::PolicyLoadError>().is_some_and(|refused| match &refused.error.error {
        perennial_policy::PolicyError::Fetch { plugin, .. } => {
            ["oci://", "https://", "s3://"].iter().any(|scheme| plugin.starts_with(scheme))
        }
        _ => false,
    })
}

/// Records on the job's status (`status.policies`) why a policy of a job that could not start
/// did not load.
fn record_refused(store: &Mutex<Store>, job: &JobConfig, err: &anyhow::Error) {
    let Some(refused) = err.downcast_ref::<agent::PolicyLoadError>() else { return };
    let plugin = match refused.kind {
        "trigger" => &job.trigger.plugin,
        "selector" => &job.selector.plugin,
        _ => job.splitter.as_ref().map_or("", |splitter| splitter.plugin.as_str()),
    };
    let reason = format!("{plugin}: {refused}");
    let mut store = sqlite::lock(store);
    if let Err(err) = edge::health::not_started(&mut store, &job.name, refused.kind, plugin, &reason, unix_now()) {
        tracing::warn!(job = job.name, "recording why the job's {} did not load: {err}", refused.kind);
    }
}

/// The operator's artifacts for this node, fetched over the link (or read from the node's disk,
/// verified again on every read).
struct LinkArtifacts {
    downloads: Arc<Downloads>,
    link_up: Arc<AtomicBool>,
}

/// How long a policy load waits for an artifact over a link that is up.
const ARTIFACT_WAIT: Duration = Duration::from_secs(60);

impl perennial_policy::ArtifactFetch for LinkArtifacts {
    fn fetch<'a>(
        &'a self,
        artifact_sha256: &'a str,
        size: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, String>> + Send + 'a>> {
        Box::pin(async move {
            // With the link down, only what is on disk: the job is tried again later.
            let wait = if self.link_up.load(Ordering::Relaxed) { ARTIFACT_WAIT } else { Duration::ZERO };
            self.downloads.get(artifact_sha256, size, wait).await.map_err(|err| err.to_string())
        })
    }
}

/// Queues the datasets' sample counts and the jobs' policies for the cloud when they change.
async fn queue_status_changes(store: Arc<Mutex<Store>>, outbox: Arc<Notify>) {
    let mut sent = edge::status_report::SentPolicies::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (store, mut taken) = (store.clone(), std::mem::take(&mut sent));
        let queued = tokio::task::spawn_blocking(move || {
            let mut store = sqlite::lock(&store);
            let queued = edge::status_report::queue_changes(&mut store, &mut taken, unix_now());
            (queued, taken)
        })
        .await;
        match queued {
            Ok((Ok(count), taken)) => {
                sent = taken;
                if count > 0 {
                    outbox.notify_one();
                }
            }
            Ok((Err(err), taken)) => {
                sent = taken;
                tracing::warn!("queueing status for the cloud: {err}");
            }
            Err(err) => tracing::warn!("queueing status for the cloud: {err}"),
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
