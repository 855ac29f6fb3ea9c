//! The embedded control plane: for each job, the stage machine over the edge's reports (read
//! from the edge outbox: the in-process link) and the local worker of the current stage; its
//! actions carried out with local processes and stage notices to the edge. It runs on one
//! thread, which also starts every worker (so that they die with it, see `workers::local`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::progress::Progress;
use perennial_api::{LifelongLearningJobStatus, Phase, Stage};
use perennial_edge::agent::{JobConfig, Wake};
use perennial_edge::sqlite::Store;
use perennial_edge::{health, report, rounds, worker_api};
use perennial_lifecycle::{self as lifecycle, Action, JobView, Observations, Settings, StageNotice, WorkerSpec};
use perennial_workers::{self as workers, LocalCommand, LocalWorkers, ProcessSpec, Readiness, WorkerContext};

/// A job as the controller runs it.
pub struct ControlledJob {
    /// `namespace/name`.
    pub key: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Its index in the edge loop, to wake it.
    pub edge_index: usize,
    pub output_dir: String,
    pub dataset_key: String,
    pub dataset_url: String,
    /// Train, Eval, Deploy workers.
    pub commands: [LocalCommand; 3],
    pub view: JobView,
    pub status: LifelongLearningJobStatus,
    /// The dataset's sample count, as the edge last said.
    pub samples: u64,
    /// Deleted from the job store while running (`perennial delete`): its workers are stopped.
    pub deleted: bool,
    /// What the edge runs the job with (its policies).
    pub config: JobConfig,
}

/// A plain pod of the manifests, run as a local process (e.g. a data generator).
pub struct LocalPod {
    pub key: String,
    pub command: LocalCommand,
}

/// What the controller needs around it.
pub struct Controller {
    pub control: Store,
    pub edge: Arc<Mutex<Store>>,
    pub jobs: Vec<ControlledJob>,
    pub pods: Vec<LocalPod>,
    pub edge_wake: Sender<Wake>,
    /// Woken by new reports in the edge outbox.
    pub wake: Receiver<()>,
    /// Signalled when the manifests were applied again (edited while running).
    pub reload: Receiver<()>,
    pub settings: Settings,
    pub lc_server: String,
    pub kb_server: String,
    pub state_dir: PathBuf,
    /// Stop when every job has completed this many rounds.
    pub rounds: Option<u64>,
    pub progress: Progress,
    /// The binary that runs `reap` (see [`perennial_workers::reaper`]).
    pub reaper: Option<PathBuf>,
    /// The stores' files as opened, looked at every sweep.
    pub store_files: StoreFiles,
}

/// How often the controller looks at its processes when nothing wakes it.
const POLL: Duration = Duration::from_millis(50);
/// How often the controller sweeps its jobs when nothing wakes it.
const SWEEP_ANYWAY: Duration = Duration::from_secs(1);
/// How often while a stopped worker is ending: its successor waits for it.
const POLL_STOPPING: Duration = Duration::from_millis(5);

/// What an action needed written to the edge store first.
enum Recorded {
    /// A new worker's name.
    Name(Result<String, String>),
    /// A stage notice (whether it applied).
    Notice(Result<bool, String>),
    Nothing,
}

/// What a sweep found.
struct Swept {
    /// When a stage's timer is due, if one is.
    recheck: Option<Duration>,
    /// Whether it changed anything (the next sweep may have more to do).
    changed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("job store: {0}")]
    Store(#[from] rusqlite::Error),
    /// A state store's file was removed or replaced while the run used it.
    #[error("{0}")]
    StoreGone(String),
}

/// A file's identity (device and inode): another file at the same path has another.
fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|meta| (meta.dev(), meta.ino()))
}

/// The state stores' files as the run opened them: a store removed or replaced under a running
/// run would take its writes into a file that no one reads again (and the next run would meet a
/// store without its history), so the run stops at once and says so.
pub struct StoreFiles {
    files: Vec<(PathBuf, Option<(u64, u64)>)>,
}

impl StoreFiles {
    pub fn of(state_dir: &std::path::Path) -> StoreFiles {
        let files = ["control.db", "edge.db"].map(|name| {
            let path = state_dir.join(name);
            let identity = file_identity(&path);
            (path, identity)
        });
        StoreFiles { files: files.into() }
    }

    fn check(&self) -> Result<(), ControlError> {
        for (path, opened) in &self.files {
            if file_identity(path) != *opened {
                return Err(ControlError::StoreGone(format!(
                    "{} was removed or replaced while this run used it: the run stops (its writes would go to a \
                     file no one reads again). Put back the file the run had, or see the next `perennial run`'s \
                     word on the state dir",
                    path.display()
                )));
            }
        }
        Ok(())
    }
}

impl Controller {
    /// Runs until `stop` is set or the rounds are done; stops every worker before returning.
    /// Returns whether the rounds were done.
    pub fn run(mut self, stop: &AtomicBool) -> Result<bool, ControlError> {
        let reaper = self.reaper.as_deref().and_then(|program| match workers::Reaper::start(program) {
            Ok(reaper) => Some(reaper),
            Err(err) => {
                tracing::warn!("cannot start the reaper ({}): a worker's own children may outlive a kill -9", err);
                None
            }
        });
        let mut workers = LocalWorkers::with_reaper(reaper);
        for pod in &self.pods {
            workers.start(self.pod_process(pod));
        }
        // The full desired state to the edge, as on a (re)connect: a crash may have come between
        // a status commit and its notice.
        let mut notices = Vec::new();
        for (i, job) in self.jobs.iter().enumerate() {
            if job.status.phase == Some(Phase::Waiting) {
                let notice = StageNotice {
                    stage: job.status.stage.unwrap_or(Stage::Train),
                    round: job.status.round,
                    failed: after_failure(&job.status),
                };
                notices.push((i, Action::Edge(notice)));
            }
        }
        let notices: Vec<(usize, &Action)> = notices.iter().map(|(i, action)| (*i, action)).collect();
        for ((i, action), recorded) in notices.iter().zip(self.record(&notices)) {
            self.act(*i, action, &self.jobs[*i].status, &mut workers, recorded);
        }
        // The deployed model's inference worker, unless a deploy is under way: on a cluster its
        // pod outlives the operator; here it stopped with the last run.
        for (i, job) in self.jobs.iter().enumerate() {
            let deploying = job.status.stage == Some(Stage::Deploy)
                && matches!(job.status.phase, Some(Phase::Ready | Phase::Starting | Phase::Running));
            if let (Some(model), false) = (&job.status.deployed, deploying) {
                let spec = WorkerSpec {
                    stage: Stage::Deploy,
                    round: model.round,
                    input: perennial_api::Input {
                        models: vec![perennial_api::Model {
                            format: model.format.clone(),
                            url: model.url.clone(),
                            metrics: model.metrics.clone(),
                        }],
                        ..Default::default()
                    },
                    previous_model: None,
                };
                let start = Action::StartWorker(spec);
                let recorded = self.record(&[(i, &start)]).pop().unwrap_or(Recorded::Nothing);
                self.act(i, &start, &job.status, &mut workers, recorded);
            }
        }
        let mut done = false;
        // A sweep runs when something may have changed: a report or an edit woke it, a worker
        // changed, the last sweep changed something (its actions may have more to follow), a
        // stage's timer is due; and every SWEEP_ANYWAY for what changes without a wake (the
        // edge's waiting reasons, health and faults).
        let mut sweep_due = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let changed = !workers.poll().is_empty();
            let now = Instant::now();
            if changed || now >= sweep_due {
                let swept = self.sweep(&mut workers)?;
                let recheck = swept.recheck.map_or(SWEEP_ANYWAY, |after| after.min(SWEEP_ANYWAY));
                sweep_due = if swept.changed { now } else { now + recheck };
                if let Some(target) = self.rounds
                    && self.jobs.iter().all(|job| job.deleted || job.status.rounds_completed >= target)
                {
                    done = true;
                    break;
                }
            }
            self.progress.tick(&self.jobs);
            // Processes are looked at often (cheap); a stopping one more often, as its successor
            // waits for it.
            let poll = if workers.any_stopping() { POLL_STOPPING } else { POLL };
            let wait = sweep_due.saturating_duration_since(Instant::now()).min(poll);
            let woken = match self.wake.recv_timeout(wait) {
                Ok(()) => true,
                Err(RecvTimeoutError::Timeout) => false,
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(wait);
                    false
                }
            };
            if woken || self.wake.try_iter().count() > 0 {
                sweep_due = Instant::now();
            }
        }
        workers.stop_all();
        Ok(done)
    }

    /// One pass over every job: apply new reports, follow the workers, act, commit, acknowledge.
    fn sweep(&mut self, workers: &mut LocalWorkers) -> Result<Swept, ControlError> {
        self.store_files.check()?;
        self.drop_deleted(workers)?;
        if self.reload.try_recv().is_ok() {
            while self.reload.try_recv().is_ok() {}
            self.reload_jobs()?;
        }
        let applied = super::state::applied_seq(&self.control)?;
        let (pending, datasets, healths, waiting, faults) = {
            let edge = perennial_edge::sqlite::lock(&self.edge);
            let pending = report::pending(&edge, 1000)?;
            let (datasets, healths) = (report::dataset_updates(&edge)?, health::all(&edge)?);
            (pending, datasets, healths, rounds::waiting_reasons(&edge)?, rounds::faults(edge.conn())?)
        };
        let last_seq = pending.last().map_or(applied, |(seq, _)| *seq);
        for (dataset, samples) in &datasets {
            for job in self.jobs.iter_mut().filter(|job| &job.dataset_key == dataset) {
                job.samples = *samples;
            }
        }
        let now = Timestamp::now();
        let mut recheck: Option<Duration> = None;
        let mut planned = Vec::new();
        for i in 0..self.jobs.len() {
            let job = &self.jobs[i];
            if job.deleted {
                continue;
            }
            let reports: Vec<lifecycle::Report> = pending
                .iter()
                .filter(|(seq, r)| *seq > applied && r.job == job.key)
                .map(|(_, r)| perennial_lifecycle::Report::from(r))
                .collect();
            let stage = job.status.stage.unwrap_or(Stage::Train);
            let worker = workers.observe(&job.key, stage, job.status.round);
            let observed = Observations { reports, worker };
            let mut status = job.status.clone();
            health::apply_job(&mut status.policies, &healths, &job.key);
            // Waiting on the edge: say why (the trigger's reason, a held policy).
            if status.phase == Some(Phase::Waiting)
                && let Some((_, why)) = waiting.iter().find(|(name, _)| *name == job.key)
            {
                status.message = Some(why.clone());
            }
            status.fault = faults.iter().find(|(name, _)| *name == job.key).map(|(_, fault)| fault.clone());
            let step = lifecycle::step(&job.view, &status, &observed, now, &self.settings);
            if let Some(after) = step.recheck_after {
                recheck = Some(recheck.map_or(after, |r: Duration| r.min(after)));
            }
            if step.status == job.status && step.actions.is_empty() {
                continue;
            }
            planned.push((i, step));
        }
        // The new statuses are committed before anything acts on them: a commit that fails (a
        // full disk) leaves the edge, the workers and the store as they were, and a crash after
        // it is made good at the next start (the edge is told every waiting stage again, a
        // missing worker is started).
        let changed = !planned.is_empty() || last_seq > applied || !datasets.is_empty();
        if changed {
            let statuses: Vec<(&str, &LifelongLearningJobStatus)> =
                planned.iter().map(|(i, step)| (self.jobs[*i].key.as_str(), &step.status)).collect();
            let now_secs = now.as_second();
            super::state::save(&mut self.control, &statuses, last_seq, &datasets, now_secs)?;
            let mut edge = perennial_edge::sqlite::lock(&self.edge);
            if last_seq > 0 {
                report::acknowledge(&mut edge, last_seq)?;
            }
            for (dataset, samples) in &datasets {
                report::dataset_reported(&mut edge, dataset, *samples)?;
            }
        }
        let actions: Vec<(usize, &Action)> =
            planned.iter().flat_map(|(i, step)| step.actions.iter().map(move |action| (*i, action))).collect();
        let mut recorded = self.record(&actions).into_iter();
        drop(actions);
        for (i, step) in planned {
            for action in &step.actions {
                self.act(i, action, &step.status, workers, recorded.next().unwrap_or(Recorded::Nothing));
            }
            if let Some((stage, round)) = finished_stage(&self.jobs[i].status, &step.status) {
                workers.finish(&self.jobs[i].key, stage, round, FINISH_GRACE);
            }
            let before = std::mem::replace(&mut self.jobs[i].status, step.status);
            self.progress.changed(&self.jobs[i], &before);
        }
        Ok(Swept { recheck, changed })
    }

    /// Takes the jobs' edited manifests: their templates for the next workers, and their policy
    /// references, which the edge swaps in between two calls.
    fn reload_jobs(&mut self) -> Result<(), ControlError> {
        let stored = super::state::jobs(&self.control)?;
        let datasets = super::state::datasets(&self.control)?;
        for job in self.jobs.iter_mut().filter(|job| !job.deleted) {
            let Some((_, stored)) = stored.iter().find(|(key, _)| *key == job.key) else { continue };
            match super::prepare_job(&self.state_dir, &job.key, stored, &datasets) {
                Ok(prepared) => {
                    if let Err(err) = prepared.make_dataset_folder() {
                        tracing::warn!(job = job.key, "the dataset's folder: {err}");
                    }
                    job.commands = prepared.commands;
                    let next = super::job_config(&job.key, stored, prepared.edge_spec);
                    if next != job.config {
                        tracing::info!(
                            job = job.key,
                            "the job changed: loading its new policies (the serving ones serve until they are ready)"
                        );
                        job.config = next.clone();
                        let _ = self.edge_wake.send(Wake::Swap(job.edge_index, Box::new(next)));
                    }
                }
                Err(err) => tracing::warn!(job = job.key, "the edited job was not taken: {err}"),
            }
        }
        Ok(())
    }

    /// Stops the jobs deleted from the job store: their workers, and their edge state.
    fn drop_deleted(&mut self, workers: &mut LocalWorkers) -> Result<(), ControlError> {
        let stored = super::state::job_keys(&self.control)?;
        for job in self.jobs.iter_mut().filter(|job| !job.deleted && !stored.contains(&job.key)) {
            tracing::info!(job = job.key, "deleted: stopping its workers");
            workers.stop(&job.key, None);
            job.deleted = true;
            let _ = self.edge_wake.send(Wake::Remove(job.edge_index));
            let mut edge = perennial_edge::sqlite::lock(&self.edge);
            perennial_edge::forget_job(&mut edge, &job.key)?;
        }
        Ok(())
    }

    /// Writes to the edge store what `actions` need there, in one transaction: each new worker's
    /// name, each stage notice. A failed commit fails them all (none is acted on).
    fn record(&self, actions: &[(usize, &Action)]) -> Vec<Recorded> {
        if !actions.iter().any(|(_, action)| matches!(action, Action::StartWorker(_) | Action::Edge(_))) {
            return actions.iter().map(|_| Recorded::Nothing).collect();
        }
        let mut edge = perennial_edge::sqlite::lock(&self.edge);
        let written = edge.write().and_then(|tx| {
            let recorded: Vec<Recorded> = actions.iter().map(|(i, action)| self.record_one(&tx, *i, action)).collect();
            tx.commit().map(|()| recorded)
        });
        written.unwrap_or_else(|err| {
            actions
                .iter()
                .map(|(_, action)| match action {
                    Action::StartWorker(_) => Recorded::Name(Err(err.to_string())),
                    Action::Edge(_) => Recorded::Notice(Err(err.to_string())),
                    _ => Recorded::Nothing,
                })
                .collect()
        })
    }

    fn record_one(&self, tx: &rusqlite::Transaction<'_>, i: usize, action: &Action) -> Recorded {
        let job = &self.jobs[i];
        match action {
            Action::StartWorker(spec) => {
                let round = i64::try_from(spec.round).unwrap_or(i64::MAX);
                let name = worker_api::issue_worker_name(tx, &job.key, round, spec.stage.report_kind());
                Recorded::Name(name.map_err(|err| err.to_string()))
            }
            Action::Edge(notice) => {
                Recorded::Notice(rounds::apply_notice_in(tx, &job.key, notice).map_err(|err| err.to_string()))
            }
            _ => Recorded::Nothing,
        }
    }

    fn act(
        &self,
        i: usize,
        action: &Action,
        status: &LifelongLearningJobStatus,
        workers: &mut LocalWorkers,
        recorded: Recorded,
    ) {
        let job = &self.jobs[i];
        match (action, recorded) {
            (Action::StartWorker(spec), Recorded::Name(Ok(name))) => {
                let process = self.worker_process(job, spec, name);
                tracing::info!(
                    job = job.key,
                    round = spec.round,
                    worker = process.name,
                    "starting the {} worker",
                    spec.stage
                );
                workers.start(process);
            }
            (Action::StartWorker(spec), recorded) => {
                let err = match recorded {
                    Recorded::Name(Err(err)) => err,
                    _ => "no worker name".to_owned(),
                };
                tracing::error!(job = job.key, "cannot start the {} worker: {err}", spec.stage)
            }
            (Action::StopWorkers { stage }, _) => workers.stop(&job.key, Some(*stage)),
            (Action::Edge(_), Recorded::Notice(Ok(_))) => {
                let _ = self.edge_wake.send(Wake::Job(job.edge_index));
            }
            (Action::Edge(notice), recorded) => {
                let err = match recorded {
                    Recorded::Notice(Err(err)) => err,
                    _ => "not recorded".to_owned(),
                };
                tracing::error!(job = job.key, "telling the edge {}/Waiting: {err}", notice.stage)
            }
            (Action::Event { warning: true, reason, message }, _) => {
                tracing::warn!(job = job.key, round = status.round, reason, "{message}")
            }
            (Action::Event { reason, message, .. }, _) => tracing::info!(job = job.key, reason, "{message}"),
        }
    }

    /// The process for a stage's worker: the template's command, its env, then Sedna's.
    fn worker_process(&self, job: &ControlledJob, spec: &WorkerSpec, name: String) -> ProcessSpec {
        let ctx = WorkerContext {
            namespace: &job.namespace,
            job_name: &job.name,
            worker_name: &name,
            lc_server: &self.lc_server,
            kb_server: &self.kb_server,
            output_dir: &job.output_dir,
            dataset_url: &job.dataset_url,
        };
        let mut injected = workers::sedna_env(spec, &ctx);
        // Paths are the host's own here: no /home/data prefix to strip.
        injected.push(("DATA_PATH_PREFIX".into(), String::new()));
        injected.push(("PERENNIAL_STATE_DIR".into(), self.state_dir.display().to_string()));
        let urls = [&job.output_dir, &job.dataset_url];
        if urls.iter().any(|u| u.starts_with("s3://"))
            && let Some(s3) = perennial_storage::S3Credentials::from_env()
        {
            injected.extend(s3.worker_env());
        }
        let command = &job.commands[spec.stage as usize];
        let log = self.state_dir.join("logs").join(&job.namespace).join(&job.name).join(format!(
            "{:04}-{}-{name}.log",
            spec.round,
            spec.stage.worker_kind()
        ));
        // Readiness matters where the stage machine asks for it: the inference worker (a train
        // or eval worker runs until it reports, as its pod does).
        let readiness = if spec.stage == Stage::Deploy { command.readiness.clone() } else { None };
        process(job.key.clone(), Some(spec.stage), spec.round, name, command, injected, log, readiness)
    }

    fn pod_process(&self, pod: &LocalPod) -> ProcessSpec {
        let injected = vec![("PERENNIAL_STATE_DIR".to_owned(), self.state_dir.display().to_string())];
        let name = pod.key.replace('/', "-");
        let log = self.state_dir.join("logs").join("pods").join(format!("{name}.log"));
        process(format!("pod/{}", pod.key), None, 0, name, &pod.command, injected, log, None)
    }
}

/// A process from a container's command: its env expanded (`$(VAR)` over the whole env), the
/// injected env after it, so that the injected values win.
#[allow(clippy::too_many_arguments)]
fn process(
    owner: String,
    stage: Option<Stage>,
    round: u64,
    name: String,
    command: &LocalCommand,
    injected: Vec<(String, String)>,
    log: PathBuf,
    readiness: Option<Readiness>,
) -> ProcessSpec {
    let mut all: Vec<(String, String)> = command.env.clone();
    all.extend(injected);
    let lookup = |var: &str| all.iter().rev().find(|(k, _)| k == var).map(|(_, v)| v.clone());
    let env: Vec<(String, String)> = all.iter().map(|(k, v)| (k.clone(), workers::expand(v, &lookup))).collect();
    let lookup = |var: &str| env.iter().rev().find(|(k, _)| k == var).map(|(_, v)| v.clone());
    ProcessSpec {
        owner,
        stage,
        round,
        name,
        program: workers::expand(&command.program, &lookup),
        args: command.args.iter().map(|a| workers::expand(a, &lookup)).collect(),
        cwd: command.cwd.clone(),
        env: env.clone(),
        restart_policy: command.restart_policy,
        log,
        readiness,
    }
}

/// How long a Train or Eval worker may go on after its stage is done (it reported) before it is
/// stopped: a worker's process ends by itself moments after its report.
const FINISH_GRACE: Duration = Duration::from_secs(10);

/// The Train or Eval stage (and its round) that `before` had a worker in and `after` has left:
/// its worker's work is done.
fn finished_stage(before: &LifelongLearningJobStatus, after: &LifelongLearningJobStatus) -> Option<(Stage, u64)> {
    let working =
        |s: &LifelongLearningJobStatus| matches!(s.phase, Some(Phase::Ready | Phase::Starting | Phase::Running));
    let stage = before.stage.filter(|stage| matches!(stage, Stage::Train | Stage::Eval) && working(before))?;
    let still = after.stage == Some(stage) && after.round == before.round && working(after);
    (!still).then_some((stage, before.round))
}

/// Whether the job came to Train/Waiting from a failure (its round's samples go back).
fn after_failure(status: &LifelongLearningJobStatus) -> bool {
    let n = status.conditions.len();
    n >= 2 && status.conditions[n - 2].type_ == Phase::Failed
}
