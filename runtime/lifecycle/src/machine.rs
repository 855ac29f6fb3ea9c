//! The machine itself. `step` first applies the reports that arrived, in order, then looks at the
//! current stage's worker and the clock, and repeats until the status stops changing (a
//! Completed moves straight on to the next stage's Waiting, as Sedna does over several syncs).

use std::time::Duration;

use jiff::Timestamp;

use perennial_api::{
    ConditionData, DeployedModel, Input, JobCondition, LifelongLearningJobStatus, MAX_CONDITIONS, Model, Phase, Stage,
    Time, WorkerRef,
};

/// The knobs, with Sedna's values where it has them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    /// First wait after a failure (Sedna: 10 s), doubled per failure in a row...
    pub backoff_base: Duration,
    /// ...up to this (Sedna: 360 s).
    pub backoff_max: Duration,
    /// Restarts (in place or re-created) of a stage's worker beyond which the stage fails.
    pub restart_limit: u32,
    /// How long a Train or Eval worker that exited 0 has to get its result reported.
    pub result_grace: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(360),
            restart_limit: 3,
            result_grace: Duration::from_secs(30),
        }
    }
}

/// What the machine needs of the job's spec.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobView {
    pub uid: String,
    /// Per stage (Train, Eval, Deploy): fail when the worker runs longer than this.
    pub timeouts: [Option<Duration>; 3],
}

/// A report from the edge: a stage's input is ready, or a stage completed or failed (the edge's
/// own steps, and the workers' results it relays).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub job_uid: String,
    pub round: u64,
    pub stage: Option<Stage>,
    /// `Ready`, `Completed` or `Failed`.
    pub status: Option<Phase>,
    pub data: ConditionData,
    pub reason: Option<String>,
    /// The edge follows this stage result with the next stage's Ready at once
    /// (`perennial_types::Report::next_follows`).
    pub next_follows: bool,
}

impl From<&perennial_types::Report> for Report {
    /// The stage machine's reading of a node's report (both control planes apply it so).
    fn from(report: &perennial_types::Report) -> Report {
        Report {
            job_uid: report.job_uid.clone(),
            round: u64::try_from(report.round).unwrap_or(0),
            stage: Some(report.phase),
            status: Some(report.status),
            data: ConditionData { input: report.input.clone(), output: report.output.clone() },
            reason: report.reason.clone(),
            next_follows: report.next_follows,
        }
    }
}

/// How the current stage's worker is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerPhase {
    /// Created, not yet running (a pod being scheduled, an image being pulled).
    Pending,
    Running,
    /// Exited 0.
    Succeeded,
    /// Exited non-zero and will not be restarted.
    Failed,
}

/// The current stage's worker, as observed.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerObservation {
    pub name: String,
    pub stage: Stage,
    pub round: u64,
    pub phase: WorkerPhase,
    /// Restarts in place (a container restarted by its restart policy).
    pub restarts: u32,
    pub node: Option<String>,
    /// When it exited, for Succeeded and Failed.
    pub finished_at: Option<Timestamp>,
    /// Exit code or reason, for messages.
    pub detail: Option<String>,
}

/// What the shell observed since the last step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observations {
    /// Reports from the edge, oldest first.
    pub reports: Vec<Report>,
    /// The worker of the current stage and round, if one exists.
    pub worker: Option<WorkerObservation>,
}

/// What a worker is started with.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSpec {
    pub stage: Stage,
    pub round: u64,
    /// Sedna's condition input: data URLs, output dir, models.
    pub input: Input,
    /// For Train: the previous round's train result (Sedna's `CLOUD_KB_INDEX`); its presence
    /// is `HAS_COMPLETED_INITIAL_TRAINING=true`.
    pub previous_model: Option<Model>,
}

/// What the edge is told: the job waits in `stage` for `round`'s step.
pub use perennial_types::StageNotice;

/// Something the shell must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create the stage's worker (Train, Eval, or the inference worker for Deploy).
    StartWorker(WorkerSpec),
    /// Stop and remove the stage's workers (all rounds: the inference worker being replaced).
    StopWorkers { stage: Stage },
    /// Tell the edge which step the job waits for.
    Edge(StageNotice),
    /// Say something on the job (a Kubernetes event, a log line).
    Event { warning: bool, reason: &'static str, message: String },
}

/// The outcome of a step.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub status: LifelongLearningJobStatus,
    pub actions: Vec<Action>,
    /// Step again after this long even if nothing is observed (a backoff, a timeout, a grace).
    pub recheck_after: Option<Duration>,
    /// The stage's worker was not among the observed ones, though this step did not just start
    /// it: gone (made again, or the stage failed over the restart limit), as far as the
    /// observation goes. A caller whose observation may lag checks it before acting.
    pub worker_gone: bool,
}

/// Runs the machine once.
pub fn step(
    job: &JobView,
    status: &LifelongLearningJobStatus,
    observed: &Observations,
    now: Timestamp,
    settings: &Settings,
) -> Step {
    let mut m = Machine {
        job,
        settings,
        now,
        status: status.clone(),
        actions: Vec::new(),
        recheck: None,
        started: false,
        worker_gone: false,
    };
    if m.status.stage.is_none() {
        m.status.start_time = Some(Time(now));
        m.enter(Stage::Train, Phase::Waiting, None);
        m.actions.push(Action::Edge(StageNotice { stage: Stage::Train, round: 0, failed: false }));
    }
    // A worker seen running (or done) ran before it reported: with its reports, its Running goes
    // first, also when it was not written yet (the operator holds a Running alone a moment).
    // Without reports the worker is followed as before (a timeout, a crash loop: no Running).
    if let Some(worker) = observed.worker.as_ref().filter(|_| !observed.reports.is_empty()) {
        m.running_first(worker);
    }
    for report in &observed.reports {
        m.apply(report);
    }
    // A Completed leads to the next stage's Waiting, a Ready to a worker: a few passes at most.
    for _ in 0..6 {
        let before = (m.status.stage, m.status.phase, m.status.round);
        m.advance(observed.worker.as_ref());
        if before == (m.status.stage, m.status.phase, m.status.round) {
            break;
        }
    }
    Step { status: m.status, actions: m.actions, recheck_after: m.recheck, worker_gone: m.worker_gone }
}

struct Machine<'a> {
    job: &'a JobView,
    settings: &'a Settings,
    now: Timestamp,
    status: LifelongLearningJobStatus,
    actions: Vec<Action>,
    recheck: Option<Duration>,
    /// A worker was started in this step: the observation predates it.
    started: bool,
    /// See [`Step::worker_gone`].
    worker_gone: bool,
}

impl Machine<'_> {
    fn stage(&self) -> Stage {
        self.status.stage.unwrap_or(Stage::Train)
    }

    fn phase(&self) -> Phase {
        self.status.phase.unwrap_or(Phase::Waiting)
    }

    /// Moves to (stage, phase) and records the condition.
    fn enter(&mut self, stage: Stage, phase: Phase, data: Option<ConditionData>) {
        let changed = self.status.stage != Some(stage) || self.status.phase != Some(phase);
        self.status.stage = Some(stage);
        self.status.phase = Some(phase);
        self.status.phase_since = Some(Time(self.now));
        let data_json = data.as_ref().and_then(|d| serde_json::to_string(d).ok());
        if let Some(data) = data {
            let current = self.status.data.get_or_insert_with(ConditionData::default);
            if data.input.is_some() {
                current.input = data.input;
            }
            if data.output.is_some() {
                current.output = data.output;
            }
        }
        if changed {
            self.status.conditions.push(JobCondition {
                type_: phase,
                status: "True".into(),
                stage,
                last_heartbeat_time: Some(Time(self.now)),
                last_transition_time: Some(Time(self.now)),
                reason: None,
                message: self.status.message.clone().filter(|_| phase == Phase::Failed),
                data: data_json,
            });
            trim(&mut self.status.conditions);
        }
    }

    fn event(&mut self, warning: bool, reason: &'static str, message: String) {
        self.actions.push(Action::Event { warning, reason, message });
    }

    fn recheck_in(&mut self, after: Duration) {
        self.recheck = Some(self.recheck.map_or(after, |r| r.min(after)));
    }

    /// Applies one report, or ignores it with the reason.
    fn apply(&mut self, report: &Report) {
        let (Some(stage), Some(kind)) = (report.stage, report.status) else {
            return self.event(true, "ReportIgnored", "a report without a stage or status".into());
        };
        let what = format!("{stage} {kind} for round {}", report.round);
        if report.job_uid != self.job.uid {
            return self.event(true, "StaleReport", format!("{what} is for another job (uid {})", report.job_uid));
        }
        let (current, phase, round) = (self.stage(), self.phase(), self.status.round);
        let expected_round = if (stage, kind) == (Stage::Train, Phase::Ready) { round + 1 } else { round };
        if stage != current || report.round != expected_round {
            return self.event(
                true,
                "StaleReport",
                format!("{what} ignored: the job is in {current}/{phase} of round {round}"),
            );
        }
        match kind {
            Phase::Ready if phase == Phase::Waiting => {
                self.status.round = report.round;
                self.status.worker = None;
                self.status.data = None;
                self.status.message = report.reason.clone();
                self.enter(stage, Phase::Ready, Some(ConditionData { input: report.data.input.clone(), output: None }));
            }
            // The edge's selector chose no model: nothing to deploy, the round is done.
            Phase::Completed if stage == Stage::Deploy && phase == Phase::Waiting => {
                self.status.message = report.reason.clone();
                self.enter(Stage::Deploy, Phase::Completed, None);
            }
            // A worker's result.
            Phase::Completed
                if stage != Stage::Deploy && matches!(phase, Phase::Ready | Phase::Starting | Phase::Running) =>
            {
                let output = report.data.output.clone().unwrap_or_default();
                if output.models.is_empty() {
                    return self.event(true, "ReportIgnored", format!("{what} ignored: it has no model"));
                }
                if stage == Stage::Train {
                    self.status.last_trained = output.models.first().cloned();
                }
                self.status.message = None;
                self.enter(stage, Phase::Completed, Some(ConditionData { input: None, output: Some(output) }));
                // On to the next stage's Waiting now, not after every report: the edge may send
                // that stage's Ready in the same batch (`next_follows`), applied next.
                self.complete(stage, report.round);
            }
            // A worker's failure while its stage runs, or the edge's (a deploy copy) while it acts.
            Phase::Failed
                if matches!(phase, Phase::Ready | Phase::Starting | Phase::Running)
                    || (stage == Stage::Deploy && phase == Phase::Waiting) =>
            {
                let why = report.reason.clone().unwrap_or_else(|| format!("{stage} failed"));
                self.fail(why);
            }
            _ => self.event(true, "StaleReport", format!("{what} ignored: the job is in {current}/{phase}")),
        }
    }

    /// Fails the current stage: stop its worker, back off, count the retry.
    fn fail(&mut self, why: String) {
        let stage = self.stage();
        if stage != Stage::Deploy || self.status.worker.is_some() {
            self.actions.push(Action::StopWorkers { stage });
        }
        self.status.retries += 1;
        let backoff = backoff(self.settings, self.status.retries);
        self.status.retry_at = Some(Time(add(self.now, backoff)));
        self.event(
            true,
            "StageFailed",
            format!("{stage} of round {} failed: {why}; back to Train in {}s", self.status.round, backoff.as_secs()),
        );
        self.status.message = Some(why);
        self.enter(stage, Phase::Failed, None);
    }

    /// Looks at the worker and the clock in the current stage.
    fn advance(&mut self, worker: Option<&WorkerObservation>) {
        let (stage, phase, round) = (self.stage(), self.phase(), self.status.round);
        let worker = worker.filter(|w| w.stage == stage && w.round == round);
        match phase {
            Phase::Waiting => {} // the edge acts
            Phase::Ready => self.start(stage, round, worker.is_some()),
            Phase::Starting | Phase::Running => self.watch(stage, phase, worker),
            Phase::Completed => self.complete(stage, round),
            Phase::Failed => {
                let retry_at = self.status.retry_at.as_ref().map_or(self.now, |t| t.0);
                if self.now >= retry_at {
                    self.status.retry_at = None;
                    self.status.worker = None;
                    self.enter(Stage::Train, Phase::Waiting, None);
                    self.actions.push(Action::Edge(StageNotice { stage: Stage::Train, round, failed: true }));
                } else {
                    self.recheck_in(until(self.now, retry_at));
                }
            }
        }
    }

    /// Ready: create the stage's worker (Deploy: replace the inference worker), unless the one
    /// for this round already exists.
    fn start(&mut self, stage: Stage, round: u64, exists: bool) {
        self.started = true;
        if !exists {
            if stage == Stage::Deploy {
                self.actions.push(Action::StopWorkers { stage });
            }
            self.actions.push(Action::StartWorker(self.worker_spec(stage, round)));
        }
        self.status.worker = Some(WorkerRef {
            name: String::new(),
            stage: Some(stage),
            round,
            restarts: 0,
            recreations: 0,
            node: None,
            started_at: Some(Time(self.now)),
        });
        self.enter(stage, Phase::Starting, None);
    }

    fn worker_spec(&self, stage: Stage, round: u64) -> WorkerSpec {
        let input = self.status.data.as_ref().and_then(|d| d.input.clone()).unwrap_or_default();
        let previous_model = if stage == Stage::Train { self.status.last_trained.clone() } else { None };
        WorkerSpec { stage, round, input, previous_model }
    }

    /// Starting, the stage's worker of this round seen running or exited 0: Running.
    fn running_first(&mut self, worker: &WorkerObservation) {
        let (stage, round) = (self.stage(), self.status.round);
        let this_worker = worker.stage == stage && worker.round == round && stage != Stage::Deploy;
        let ran = matches!(worker.phase, WorkerPhase::Running | WorkerPhase::Succeeded);
        if this_worker && self.phase() == Phase::Starting && ran {
            self.enter(stage, Phase::Running, None);
        }
    }

    /// Starting/Running: follow the worker.
    fn watch(&mut self, stage: Stage, phase: Phase, worker: Option<&WorkerObservation>) {
        let round = self.status.round;
        let mut known = self.status.worker.clone().unwrap_or_default();
        let started_at = known.started_at.as_ref().map_or(self.now, |t| t.0);
        if let Some(timeout) = self.job.timeouts[stage as usize] {
            let deadline = add(started_at, timeout);
            if self.now >= deadline {
                return self
                    .fail(format!("the {stage} worker ran longer than {}s (timeoutSeconds)", timeout.as_secs()));
            }
            self.recheck_in(until(self.now, deadline));
        }
        let Some(worker) = worker else {
            if self.started {
                return; // just created; the next observation will show it
            }
            // Vanished (deleted, node lost, the embedded mode restarted): start it again, counted.
            self.worker_gone = true;
            known.recreations += 1;
            known.restarts += 1;
            if known.restarts > self.settings.restart_limit {
                return self.fail(format!("the {stage} worker vanished {} times", known.restarts));
            }
            self.event(
                true,
                "WorkerVanished",
                format!("the {stage} worker of round {round} is gone; starting it again"),
            );
            // As on Ready: an inference worker of another round that survived (a stop that
            // failed, a crash between the status write and the stop) goes first.
            if stage == Stage::Deploy {
                self.actions.push(Action::StopWorkers { stage });
            }
            self.actions.push(Action::StartWorker(self.worker_spec(stage, round)));
            self.status.worker = Some(known);
            return;
        };
        // Restarts in place (of this instance) add to the re-creations this stage already had.
        let restarts = known.recreations + worker.restarts;
        // A pending worker's name and node are recorded with a change that is written anyway
        // (this step's start, its running, a restart): on a cluster a status write of their own
        // would cost the API server one more request per stage, for what the pod shows anyway.
        if worker.phase == WorkerPhase::Pending && restarts == known.restarts && !self.started {
            return;
        }
        known.name = worker.name.clone();
        known.node = worker.node.clone().or(known.node);
        known.restarts = restarts;
        self.status.worker = Some(known);
        if restarts > self.settings.restart_limit {
            return self.fail(format!("the {stage} worker {} is crash-looping ({restarts} restarts)", worker.name));
        }
        let detail = worker.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        match (stage, worker.phase) {
            (_, WorkerPhase::Pending) => {}
            (Stage::Deploy, WorkerPhase::Running | WorkerPhase::Succeeded) => {
                self.enter(Stage::Deploy, Phase::Completed, None);
            }
            (_, WorkerPhase::Running) if phase == Phase::Starting => self.enter(stage, Phase::Running, None),
            (_, WorkerPhase::Running) => {}
            (_, WorkerPhase::Failed) => self.fail(format!("the {stage} worker {} failed{detail}", worker.name)),
            // Exited 0 but its result has not come (yet): Sedna would complete with no model.
            (_, WorkerPhase::Succeeded) => {
                let deadline = add(worker.finished_at.unwrap_or(self.now), self.settings.result_grace);
                if self.now >= deadline {
                    self.fail(format!("the {stage} worker {} exited without reporting a result", worker.name));
                } else {
                    self.recheck_in(until(self.now, deadline));
                }
            }
        }
    }

    /// Completed: on to the next stage; after Deploy, the round is done.
    fn complete(&mut self, stage: Stage, round: u64) {
        if stage == Stage::Deploy {
            let chosen = self.status.data.as_ref().and_then(|d| d.input.as_ref()).and_then(|i| i.models.first());
            if let (Some(model), true) = (chosen, self.status.worker.is_some()) {
                self.status.deployed = Some(DeployedModel {
                    round,
                    url: model.url.clone(),
                    format: model.format.clone(),
                    metrics: model.metrics.clone(),
                    since: Some(Time(self.now)),
                });
            }
            self.status.rounds_completed += 1;
            self.status.retries = 0;
        }
        self.status.worker = None;
        let next = stage.next();
        self.enter(next, Phase::Waiting, None);
        self.actions.push(Action::Edge(StageNotice { stage: next, round, failed: false }));
    }
}

/// Keeps the newest [`MAX_CONDITIONS`] conditions, and the `data` only on the newest of each
/// stage and type: older data is history that the status's `data`, `lastTrained` and `deployed`
/// already tell, and every status write costs the API server in proportion to the stored job.
fn trim(conditions: &mut Vec<JobCondition>) {
    let excess = conditions.len().saturating_sub(MAX_CONDITIONS);
    conditions.drain(..excess);
    let mut seen = std::collections::HashSet::new();
    for condition in conditions.iter_mut().rev() {
        if !seen.insert((condition.stage, condition.type_)) {
            condition.data = None;
        }
    }
}

/// Sedna's backoff: base × 2^(n−1), at most max.
pub fn backoff(settings: &Settings, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(20);
    settings.backoff_base.saturating_mul(1 << doublings).min(settings.backoff_max)
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    let ms = t.as_millisecond().saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Timestamp::from_millisecond(ms).unwrap_or(Timestamp::MAX)
}

fn until(now: Timestamp, then: Timestamp) -> Duration {
    Duration::from_millis(u64::try_from(then.as_millisecond() - now.as_millisecond()).unwrap_or(0))
}
