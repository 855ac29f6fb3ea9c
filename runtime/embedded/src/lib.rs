//! The embedded mode behind `perennial run`: the whole system on one machine, no cluster. The
//! manifests go to a local job store (SQLite) instead of an API server; the edge core runs the
//! jobs' datasets, policies and round files; the stage machine drives them; workers are local
//! processes; the link between the halves is in-process (the edge outbox, read and
//! acknowledged by the control plane). Relative paths in Dataset and job manifests are under
//! the state dir; a template's relative `workingDir` is under its manifest's folder.

pub mod admit;
pub mod controller;
pub mod pairing;
pub mod progress;
pub mod state;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use self::controller::{ControlledJob, Controller, LocalPod};
use self::state::Stored;
use perennial_api::manifest;
use perennial_api::{self as resources, Dataset, LifelongLearningJob};
use perennial_edge::agent::{self, JobConfig, JobRunner, LoopSettings, Wakes};
use perennial_edge::model_copy::model_copier;
use perennial_edge::sqlite::Store;
use perennial_edge::{self as edge, IndexFile, JobSpec, LocalFile, S3Index, worker_api};
use perennial_lifecycle::{JobView, Settings};
use perennial_policy::PolicyHost;
use perennial_storage::S3Credentials;
use perennial_workers::{LocalCommand, RestartPolicy, local_command};

/// How `perennial run` runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Manifest files or folders to apply first; none: run every stored job.
    pub paths: Vec<PathBuf>,
    pub state_dir: PathBuf,
    /// The policies' compile cache; none: the one every subcommand shares by default.
    pub cache_dir: Option<PathBuf>,
    /// Stop (successfully) when every job has completed this many rounds.
    pub rounds: Option<u64>,
    /// The worker report API (`LC_SERVER` for the workers).
    pub bind: SocketAddr,
    /// Sedna's `KB_SERVER` for train and eval workers.
    pub kb_server: String,
    /// The stat fallback of dataset tailing.
    pub poll: Duration,
    /// Live progress lines (a terminal) or plain lines.
    pub terminal: bool,
    pub settings: Settings,
    /// The `perennial` binary, to start `perennial reap` with: whatever a worker started dies
    /// with the run even on kill -9. None: only the workers' direct children do.
    pub reaper: Option<PathBuf>,
    /// The `perennial` binary, to compile new policies in a child process with: a compile's
    /// memory then never stays in the run. None: compiles stay in this process.
    pub compiler: Option<PathBuf>,
}

impl RunOptions {
    /// A run of the manifests at `paths`, its state in `state_dir`, its worker API on a free
    /// port of 127.0.0.1, the stat fallback each second, plain lines, the default settings and
    /// no child processes of `perennial`: where a bench or an embedding program starts from.
    pub fn local(paths: Vec<PathBuf>, state_dir: PathBuf) -> RunOptions {
        RunOptions {
            paths,
            state_dir,
            cache_dir: None,
            rounds: None,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            kb_server: String::new(),
            poll: Duration::from_secs(1),
            terminal: false,
            settings: Settings::default(),
            reaper: None,
            compiler: None,
        }
    }
}

/// How a run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// Every job completed the rounds asked for.
    RoundsDone,
    /// Stopped by a signal; the next run resumes.
    Stopped,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("--state-dir {path}: {cause}")]
    StateDir { path: String, cause: std::io::Error },
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<resources::FieldErrors>),
    /// Manifests refused for what this machine would meet running them, a line each.
    #[error("{}", .0.join("\n"))]
    Refused(Vec<String>),
    /// A job whose policy of `kind` cannot serve: fetched, compiled or configured, it failed.
    #[error("{origin}: LifelongLearningJob {job}: {}: {reason}", policy_field(kind))]
    Policy { origin: String, job: String, kind: &'static str, reason: String },
    #[error("{0}")]
    Job(String),
    #[error("stopped (Ctrl-C or SIGTERM) while the jobs' policies loaded, before any job started")]
    StoppedAtStart,
    #[error("nothing to run: give manifest files or folders (no job is stored in {0})")]
    NothingToRun(String),
    #[error(transparent)]
    Store(#[from] perennial_edge::sqlite::StoreError),
    #[error("job store: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("worker API on {address}: {cause}{}", bind_hint(cause))]
    Bind { address: SocketAddr, cause: std::io::Error },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Lock(#[from] perennial_edge::state_lock::LockError),
    #[error(transparent)]
    Pairing(#[from] pairing::PairingError),
    /// The run did not start, and the manifests it had stored were taken back.
    #[error("{error}\n(the run did not start: nothing of the manifests given was kept)")]
    TakenBack { error: Box<RunError> },
}

/// What to do about a port that cannot be taken.
fn bind_hint(cause: &std::io::Error) -> &'static str {
    if cause.kind() == std::io::ErrorKind::AddrInUse {
        " (another process holds it: stop it, or give --bind-port another port, 0 for any free one)"
    } else {
        ""
    }
}

/// Where a job's manifest names its policy of `kind`.
fn policy_field(kind: &str) -> &'static str {
    match kind {
        "splitter" => "spec.dataset.splitPolicy",
        "selector" => "spec.deploySpec.selectPolicy",
        _ => "spec.trainSpec.trigger.policy",
    }
}

/// Runs the jobs until the rounds are done or `stop` is set.
pub async fn run(options: RunOptions, stop: Arc<AtomicBool>) -> Result<RunEnd, RunError> {
    let state_error = |cause| RunError::StateDir { path: options.state_dir.display().to_string(), cause };
    // Nothing given and nothing stored: said without leaving a state dir behind.
    if options.paths.is_empty() && !options.state_dir.join("control.db").exists() {
        return Err(RunError::NothingToRun(options.state_dir.display().to_string()));
    }
    let made_state_dir = !options.state_dir.exists();
    std::fs::create_dir_all(&options.state_dir).map_err(state_error)?;
    let state_dir = options.state_dir.canonicalize().map_err(state_error)?;
    let lock = perennial_edge::state_lock::lock(&state_dir, "perennial run")?;
    let mut control = state::open(&state_dir)?;
    // The two stores checked against each other before either is written to.
    let mut edge_store = pairing::open_edge(&state_dir, &mut control)?;
    // The stores' files as opened, taken now: one removed after this (even before the run
    // starts its jobs) stops the run.
    let store_files = controller::StoreFiles::of(&state_dir);
    // A stop asked while the policies load (a registry that does not answer may take minutes)
    // ends the start at once: nothing is stored before they all loaded.
    let admitting = tokio::select! {
        admitted = bind_and_admit(&options, &state_dir, &mut control) => admitted,
        () = stop_asked(&stop) => Err(RunError::StoppedAtStart),
    };
    let (listener, host, admitted) = match admitting {
        Ok(admitted) => admitted,
        Err(err) => {
            // Refused before anything was stored: a state dir this run made goes with it.
            if made_state_dir {
                drop((control, edge_store, lock));
                let _ = std::fs::remove_dir_all(&state_dir);
            }
            return Err(err);
        }
    };
    let _lock = lock;
    let undo = admitted.undo.clone();
    let started = tokio::select! {
        started = start(&options, &state_dir, &mut control, &mut edge_store, admitted, &host) => started,
        () = stop_asked(&stop) => Err(RunError::StoppedAtStart),
    };
    let (controlled, mut runners, pods) = match started {
        Ok(started) => started,
        Err(err) => return Err(take_back(&mut control, &mut edge_store, &undo, err)),
    };
    let edge_store = Arc::new(Mutex::new(edge_store));

    let address = listener.local_addr()?;
    let (wake_control, woken) = mpsc::channel::<()>();
    let on_report: worker_api::OnReport = {
        let wake = wake_control.clone();
        // The control plane applies the report and tells the edge's loop what follows.
        Arc::new(move |_moved: Option<&str>| {
            let _ = wake.send(());
        })
    };
    let api = worker_api::router(edge_store.clone(), on_report.clone(), None);

    let wakes = Wakes::new();
    let edge_wake = wakes.sender();
    let edge_stop = Arc::new(AtomicBool::new(false));
    let swapper = agent::Swapper::new(host.clone(), tokio::runtime::Handle::current());
    let (reload_control, reload) = mpsc::channel::<()>();
    let _manifest_watch = if options.paths.is_empty() {
        None
    } else {
        let admission = Admission {
            state_dir: state_dir.clone(),
            host: host.clone(),
            runtime: tokio::runtime::Handle::current(),
            edge: edge_store.clone(),
        };
        watch_manifests(&options.paths, admission, reload_control, wake_control.clone())
    };
    let edge_thread = {
        let (store, stop, on_report) = (edge_store.clone(), edge_stop.clone(), on_report.clone());
        std::thread::Builder::new()
            .name("edge".into())
            .spawn(move || agent::run_jobs(&store, &mut runners, &stop, wakes, &|| on_report(None), Some(&swapper)))?
    };
    tracing::info!("worker report API on {address}; state in {}", state_dir.display());
    let progress = progress::Progress::new(options.terminal, &controlled);
    let controller = Controller {
        control,
        edge: edge_store,
        jobs: controlled,
        pods,
        edge_wake,
        wake: woken,
        reload,
        settings: options.settings,
        lc_server: format!("http://{address}"),
        kb_server: options.kb_server.clone(),
        state_dir: state_dir.clone(),
        rounds: options.rounds,
        progress,
        reaper: options.reaper.clone(),
        store_files,
    };
    let (finished_tx, finished) = tokio::sync::oneshot::channel();
    let control_thread = {
        let stop = stop.clone();
        std::thread::Builder::new().name("control".into()).spawn(move || {
            let outcome = controller.run(&stop);
            let _ = finished_tx.send(());
            outcome
        })?
    };
    perennial_edge::serve::serve(listener, api, async move {
        let _ = finished.await;
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    edge_stop.store(true, Ordering::Relaxed);
    let _ = wake_control.send(());
    let outcome = tokio::task::spawn_blocking(move || control_thread.join())
        .await
        .map_err(|err| RunError::Job(err.to_string()))?
        .map_err(|_| RunError::Job("the control thread panicked".into()))?;
    let _ = tokio::task::spawn_blocking(move || edge_thread.join()).await;
    match outcome {
        Ok(true) => Ok(RunEnd::RoundsDone),
        Ok(false) => Ok(RunEnd::Stopped),
        Err(err) => Err(RunError::Job(err.to_string())),
    }
}

/// Returns once `stop` is set (the signal handler only sets it).
async fn stop_asked(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The worker API's port, taken first (a port in use refuses the run before anything is
/// stored), the policy host, and the manifests given, admitted.
async fn bind_and_admit(
    options: &RunOptions,
    state_dir: &Path,
    control: &mut Store,
) -> Result<(tokio::net::TcpListener, PolicyHost, admit::Admitted), RunError> {
    let listener = tokio::net::TcpListener::bind(options.bind)
        .await
        .map_err(|cause| RunError::Bind { address: options.bind, cause })?;
    let host =
        PolicyHost::with_shared_cache(options.cache_dir.clone(), None).map_err(|e| RunError::Job(e.to_string()))?;
    if let Some(exe) = &options.compiler {
        host.compile_in_child_process(exe.clone());
    }
    let admitted = if options.paths.is_empty() {
        admit::Admitted::default()
    } else {
        admit::admit(control, state_dir, &options.paths, &host).await?
    };
    Ok((listener, host, admitted))
}

/// What a run starts with: the jobs as the control plane drives them, as the edge runs them, and
/// the stored Pods.
type Started = (Vec<ControlledJob>, Vec<JobRunner>, Vec<LocalPod>);

/// Everything a run needs before its threads start: the jobs to run (the admitted ones, or every
/// stored one), each registered on the edge with its policies, output and index.
async fn start(
    options: &RunOptions,
    state_dir: &Path,
    control: &mut Store,
    edge_store: &mut Store,
    admitted: admit::Admitted,
    host: &PolicyHost,
) -> Result<Started, RunError> {
    let (job_keys, pod_keys, mut admitted_policies) = (admitted.jobs, admitted.pods, admitted.policies);
    let datasets = state::datasets(control)?;
    let mut jobs_in_store = state::jobs(control)?;
    if !options.paths.is_empty() {
        jobs_in_store.retain(|(key, _)| job_keys.contains(key));
    }
    if jobs_in_store.is_empty() {
        return Err(RunError::NothingToRun(state_dir.display().to_string()));
    }
    let pods: Vec<LocalPod> = state::list::<k8s_openapi::api::core::v1::Pod>(control, "Pod")?
        .into_iter()
        .filter(|(key, _)| options.paths.is_empty() || pod_keys.contains(key))
        .map(|(key, stored)| pod_command(&key, &stored).map(|command| LocalPod { key, command }))
        .collect::<Result<_, _>>()?;

    let s3 = S3Credentials::from_env();
    let mut controlled = Vec::new();
    let mut runners = Vec::new();
    for (index, (key, stored)) in jobs_in_store.into_iter().enumerate() {
        let job = prepare_job(state_dir, &key, &stored, &datasets)?;
        job.make_dataset_folder()?;
        edge::register_job(edge_store, &key, &stored.uid, &job.edge_spec)?;
        let config = job_config(&key, &stored, job.edge_spec.clone());
        // Loaded already to admit the job, unless it was not given now (a resumed run).
        let policies = match admitted_policies.iter().position(|(admitted, _)| same_policies(admitted, &config)) {
            Some(at) => admitted_policies.swap_remove(at).1,
            None => {
                let loaded = agent::load_policies(host, &config)
                    .await
                    .map_err(|err| RunError::Job(format!("job {key}: {err}")))?;
                loaded.release();
                loaded
            }
        };
        // Checked again at every start, not only at admission: a symlink on its path may point
        // elsewhere now, a mount may have turned read-only.
        edge::output::check(&job.edge_spec.output_dir, s3.as_ref())
            .map_err(|err| RunError::Job(format!("job {key}: spec.outputDir: {err}")))?;
        edge::output::clear_temporary(&job.edge_spec.output_dir);
        let output = edge::output::output_operator(&job.edge_spec.output_dir, s3.as_ref())
            .map_err(|err| RunError::Job(format!("job {key}: spec.outputDir: {err}")))?;
        let output = opendal::blocking::Operator::new(output).map_err(|err| RunError::Job(err.to_string()))?;
        let index_file: Box<dyn IndexFile + Send> = if job.edge_spec.dataset_url.starts_with("s3://") {
            Box::new(
                S3Index::open(&job.edge_spec.dataset_url, s3.as_ref())
                    .map_err(|err| RunError::Job(format!("job {key}: the dataset index: {err}")))?,
            )
        } else {
            Box::new(LocalFile { path: job.edge_spec.dataset_url.clone().into() })
        };
        let dataset_dir = Path::new(&job.edge_spec.dataset_url).parent().map(|p| p.display().to_string());
        let roots = [Some(job.edge_spec.output_dir.clone()), dataset_dir].into_iter().flatten().collect();
        let output_dir = job.edge_spec.output_dir.clone();
        let copy_model = model_copier(tokio::runtime::Handle::current(), s3.clone(), output_dir, roots);
        let settings = LoopSettings { poll: options.poll, ..LoopSettings::default() };
        let controlled_config = config.clone();
        let runner = JobRunner { job: config, policies, index: index_file, output, copy_model, settings };
        // The policies serving now, whatever an earlier run (or a swap in it) recorded.
        agent::record_serving(edge_store, &runner);
        let mut status = state::status(control, &key)?;
        status.policies.clear();
        edge::health::apply_job(&mut status.policies, &edge::health::all(edge_store)?, &key);
        state::save(control, &[(&key, &status)], 0, &[], 0)?;
        runners.push(runner);
        let (namespace, name) = key.split_once('/').map(|(n, m)| (n.to_owned(), m.to_owned())).unwrap_or_default();
        let spec = &stored.object.spec;
        let timeouts =
            [spec.train_spec.timeout_seconds, spec.eval_spec.timeout_seconds, spec.deploy_spec.timeout_seconds]
                .map(|t| t.map(Duration::from_secs));
        controlled.push(ControlledJob {
            key,
            namespace,
            name,
            uid: stored.uid.clone(),
            edge_index: index,
            output_dir: job.edge_spec.output_dir.clone(),
            dataset_key: job.edge_spec.dataset.clone(),
            dataset_url: job.edge_spec.dataset_url.clone(),
            commands: job.commands,
            view: JobView { uid: stored.uid, timeouts },
            status,
            samples: 0,
            deleted: false,
            config: controlled_config,
        });
    }
    Ok((controlled, runners, pods))
}

/// A run that was refused after its manifests were stored takes them back (and the edge forgets
/// the jobs that were new), so that the next run does not meet them; the error says so.
fn take_back(control: &mut Store, edge: &mut Store, undo: &state::Undo, err: RunError) -> RunError {
    // Nothing given now (a resumed run): nothing to take back.
    if matches!(err, RunError::NothingToRun(_)) || undo.is_empty() {
        return err;
    }
    let new_jobs = undo.new_keys("LifelongLearningJob");
    let taken_back = state::take_back(control, undo)
        .map_err(|e| e.to_string())
        .and_then(|()| new_jobs.iter().try_for_each(|job| edge::forget_job(edge, job)).map_err(|e| e.to_string()));
    match taken_back {
        Ok(()) => RunError::TakenBack { error: Box::new(err) },
        Err(why) => RunError::Job(format!("{err}\n(and the manifests stored for it could not be taken back: {why})")),
    }
}

/// What the edge runs a job with.
pub(crate) fn job_config(key: &str, stored: &Stored<LifelongLearningJob>, spec: JobSpec) -> JobConfig {
    JobConfig {
        name: key.to_owned(),
        uid: stored.uid.clone(),
        spec,
        splitter: stored.object.spec.dataset.split_policy.clone(),
        trigger: stored.object.spec.trigger_policy(),
        selector: stored.object.spec.select_policy(),
        fallback_trigger: stored.object.spec.fallback_trigger(),
        policy_artifacts: Default::default(),
        registry_auth: Default::default(),
    }
}

/// Whether the policies loaded for `a` are the ones `b` runs with: the same job and the same
/// references (the uid, given only once the job is stored, does not matter to them).
fn same_policies(a: &JobConfig, b: &JobConfig) -> bool {
    (&a.name, &a.splitter, &a.trigger, &a.selector, &a.fallback_trigger)
        == (&b.name, &b.splitter, &b.trigger, &b.selector, &b.fallback_trigger)
}

/// A job resolved for this machine.
pub(crate) struct PreparedJob {
    pub edge_spec: JobSpec,
    pub commands: [LocalCommand; 3],
    /// The folder of a dataset under the state dir.
    dataset_folder: Option<PathBuf>,
}

impl PreparedJob {
    /// Makes the folder of a dataset under the state dir, so that it is watched from the start
    /// (not polled) even before its generator writes the first line.
    pub fn make_dataset_folder(&self) -> std::io::Result<()> {
        let Some(folder) = &self.dataset_folder else { return Ok(()) };
        std::fs::create_dir_all(folder)
            .map_err(|err| std::io::Error::new(err.kind(), format!("the dataset's folder {}: {err}", folder.display())))
    }
}

pub(crate) fn prepare_job(
    state_dir: &Path,
    key: &str,
    stored: &Stored<LifelongLearningJob>,
    datasets: &[(String, Stored<Dataset>)],
) -> Result<PreparedJob, RunError> {
    let spec = &stored.object.spec;
    let namespace = key.split_once('/').map_or("default", |(n, _)| n);
    let dataset_key = format!("{namespace}/{}", spec.dataset.name);
    let dataset = datasets.iter().find(|(k, _)| *k == dataset_key).map(|(_, d)| &d.object).ok_or_else(|| {
        RunError::Job(format!("LifelongLearningJob {key}: spec.dataset.name: no Dataset {dataset_key}"))
    })?;
    let dataset_folder = (!dataset.spec.url.contains("://") && Path::new(&dataset.spec.url).is_relative())
        .then(|| PathBuf::from(resolve(state_dir, &dataset.spec.url)).parent().map(Path::to_owned))
        .flatten();
    let edge_spec = JobSpec {
        dataset: dataset_key,
        dataset_url: resolve(state_dir, &dataset.spec.url),
        dataset_format: dataset.spec.format.to_ascii_lowercase(),
        output_dir: resolve(state_dir, &spec.output_dir),
        train_prob: spec.dataset.train_prob,
        eval_set_size: spec.eval_spec.eval_set_size,
        decision_records: spec.decision_records,
    };
    let command = |template, field: &str, restart| {
        local_command(template, field, &stored.dir, restart)
            .map_err(|err| RunError::Job(format!("LifelongLearningJob {key}: {err}")))
    };
    let commands = [
        command(&spec.train_spec.template, "spec.trainSpec.template", RestartPolicy::OnFailure)?,
        command(&spec.eval_spec.template, "spec.evalSpec.template", RestartPolicy::OnFailure)?,
        command(&spec.deploy_spec.template, "spec.deploySpec.template", RestartPolicy::Always)?,
    ];
    Ok(PreparedJob { edge_spec, commands, dataset_folder })
}

pub(crate) fn pod_command(
    key: &str,
    stored: &Stored<k8s_openapi::api::core::v1::Pod>,
) -> Result<LocalCommand, RunError> {
    let template = k8s_openapi::api::core::v1::PodTemplateSpec {
        metadata: Some(stored.object.metadata.clone()),
        spec: stored.object.spec.clone(),
    };
    local_command(&template, "spec", &stored.dir, RestartPolicy::Always)
        .map_err(|err| RunError::Job(format!("Pod {key}: {}", err.trim_start_matches("spec."))))
}

/// A relative path is under the state dir; absolute paths and URLs stay as they are.
pub fn resolve(state_dir: &Path, url: &str) -> String {
    if url.contains("://") || Path::new(url).is_absolute() {
        url.to_owned()
    } else {
        state_dir.join(url).display().to_string()
    }
}

/// What a live edit is admitted with.
struct Admission {
    state_dir: PathBuf,
    host: PolicyHost,
    runtime: tokio::runtime::Handle,
    /// Where a refused policy is recorded, for the job's status.
    edge: Arc<Mutex<Store>>,
}

impl Admission {
    /// Admits the edited manifests, as at the start: all or nothing. A policy refused is shown
    /// on its job's status (the previous one serves on); an accepted job's earlier refusals go.
    fn admit(&self, paths: &[PathBuf]) -> Result<admit::Admitted, RunError> {
        let mut control = state::open(&self.state_dir)?;
        let outcome = self.runtime.block_on(admit::admit(&mut control, &self.state_dir, paths, &self.host));
        let mut edge = perennial_edge::sqlite::lock(&self.edge);
        let recorded = match &outcome {
            Ok(admitted) => admitted.jobs.iter().try_for_each(|job| edge::health::clear_rejected(&mut edge, job)),
            Err(RunError::Policy { job, kind, reason, .. }) => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                edge::health::rejected(&mut edge, job, kind, reason, now)
            }
            Err(_) => Ok(()),
        };
        if let Err(err) = recorded {
            tracing::warn!("the edge state: {err}");
        }
        outcome
    }
}

/// Watches the manifest files and folders of the run: an edited manifest is checked and applied
/// again (a bad one is refused, said, and changes nothing), then the control plane takes it.
fn watch_manifests(
    paths: &[PathBuf],
    admission: Admission,
    reload: mpsc::Sender<()>,
    wake: mpsc::Sender<()>,
) -> Option<notify::RecommendedWatcher> {
    use notify::{RecursiveMode, Watcher};
    let (changed, events) = mpsc::channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let manifest = |p: &PathBuf| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"));
        if event.is_ok_and(|e| (e.kind.is_modify() || e.kind.is_create()) && e.paths.iter().any(manifest)) {
            let _ = changed.send(());
        }
    })
    .ok()?;
    for path in paths {
        // A file's folder: editors replace files by renaming over them.
        let folder = if path.is_dir() { path.clone() } else { path.parent().map(Path::to_owned).unwrap_or_default() };
        let folder = if folder.as_os_str().is_empty() { PathBuf::from(".") } else { folder };
        if let Err(err) = watcher.watch(&folder, RecursiveMode::NonRecursive) {
            tracing::warn!("cannot watch {} for edits: {err}", folder.display());
        }
    }
    let paths = paths.to_vec();
    std::thread::Builder::new()
        .name("manifests".into())
        .spawn(move || {
            while events.recv().is_ok() {
                // An editor's save is several events: take them as one.
                std::thread::sleep(Duration::from_millis(50));
                while events.try_recv().is_ok() {}
                match admission.admit(&paths) {
                    Ok(_) => {
                        let _ = reload.send(());
                    }
                    Err(err) => tracing::warn!("the edited manifests were not applied: {err}"),
                }
                // Either way the status changes: the edit, or its refusal.
                let _ = wake.send(());
            }
        })
        .ok()?;
    Some(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policies admitted with a job are the ones its run starts with: not loaded twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_policies_admitted_with_a_job_are_the_ones_its_run_uses() {
        let root = tempfile::tempdir().unwrap();
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/thermal-comfort");
        for file in ["dataset.yaml", "job.yaml"] {
            std::fs::copy(example.join(file), root.path().join(file)).unwrap();
        }
        let state_dir = root.path().join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        let mut control = state::open(&state_dir).unwrap();
        let host = PolicyHost::new(None, None).unwrap();
        let admitted = admit::admit(&mut control, &state_dir, &[root.path().to_owned()], &host).await.unwrap();
        assert_eq!(admitted.jobs, ["default/thermal-comfort"]);
        // As the run builds it, from the stored job (which has its uid now).
        let (key, stored) = state::jobs(&control).unwrap().pop().unwrap();
        assert!(!stored.uid.is_empty());
        let job = prepare_job(&state_dir, &key, &stored, &state::datasets(&control).unwrap()).unwrap();
        let config = job_config(&key, &stored, job.edge_spec);
        let found = admitted.policies.iter().filter(|(admitted, _)| same_policies(admitted, &config)).count();
        assert_eq!(found, 1);
        // Another trigger is another policy.
        let other = JobConfig { trigger: perennial_types::PolicyRef::new("builtin:count-or-age-trigger"), ..config };
        assert!(!admitted.policies.iter().any(|(admitted, _)| same_policies(admitted, &other)));
    }
}
