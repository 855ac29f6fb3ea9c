//! The embedded mode's workers: local processes, as a kubelet would run the pods. Each runs in
//! its own process group with its output appended to a log file; it is restarted by its
//! restart policy with a growing delay (counted, so that the stage machine sees a crash loop);
//! it dies with Perennial (killed by the reaper, or by the kernel with `PR_SET_PDEATHSIG` when
//! there is no reaper), so a killed `perennial run` leaves no orphan that could report twice;
//! and it is stopped with SIGTERM, then SIGKILL after a grace period. A stop never waits: the
//! stopping processes are followed by `poll`, so that a worker slow to end holds up no other job
//! (a new worker of the same owner and stage waits for its predecessor to end, as its port or
//! files may still be held).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use jiff::Timestamp;

use perennial_api::Stage;
use perennial_lifecycle::{WorkerObservation, WorkerPhase};

use super::probe::{ProbeState, Readiness};
use super::reaper::Reaper;

/// Kubernetes' restart policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

/// One process to run.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    /// Whose worker it is: a job's `namespace/name`, or a pod's.
    pub owner: String,
    /// The job stage it serves; none for a plain pod.
    pub stage: Option<Stage>,
    pub round: u64,
    pub name: String,
    pub program: String,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    /// The whole environment of the process, on top of a cleared one plus PATH, HOME and LANG.
    pub env: Vec<(String, String)>,
    pub restart_policy: RestartPolicy,
    /// Stdout and stderr go here (appended).
    pub log: PathBuf,
    /// How its readiness is told (a container's `readinessProbe`); none: running is ready.
    pub readiness: Option<Readiness>,
}

struct Process {
    spec: ProcessSpec,
    child: Option<Child>,
    started: Instant,
    restarts: u32,
    /// Waiting to be restarted at this time.
    restart_at: Option<Instant>,
    /// The readiness probe's progress on the live process.
    probe: Option<ProbeState>,
    /// How it ended, when it will not be restarted.
    ended: Option<(WorkerPhase, String, Timestamp)>,
    /// Not started yet: a stopping process of the same owner and stage has not ended.
    after_stop: bool,
    /// Its stage is done: stopped if still running then, never restarted.
    finish_by: Option<Instant>,
}

/// A process told to end (SIGTERM), killed with its group when it ends or its grace is over.
struct Stopping {
    child: Child,
    owner: String,
    stage: Option<Stage>,
    deadline: Instant,
}

/// First and longest delay before restarting a crashed process (a kubelet's crash-loop backoff,
/// shortened for one machine).
const RESTART_DELAY: Duration = Duration::from_millis(500);
const RESTART_DELAY_MAX: Duration = Duration::from_secs(30);
/// How long a stopped process has between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// The running local processes.
#[derive(Default)]
pub struct LocalWorkers {
    processes: Vec<Process>,
    stopping: Vec<Stopping>,
    /// Told of every worker group, so that none outlives the run.
    reaper: Option<Reaper>,
}

impl LocalWorkers {
    pub fn new() -> Self {
        LocalWorkers::default()
    }

    /// Workers whose groups `reaper` kills if the run ends without stopping them (kill -9).
    pub fn with_reaper(reaper: Option<Reaper>) -> Self {
        LocalWorkers { processes: Vec::new(), stopping: Vec::new(), reaper }
    }

    /// Starts a process. A process that cannot be started (no such program) is recorded as
    /// failed, with the cause, for the stage machine to see.
    pub fn start(&mut self, spec: ProcessSpec) {
        // One of this owner and stage whose stage is done but which lingers is stopped now: the
        // next worker of a stage starts only once the last one is gone.
        let (owner, stage) = (spec.owner.clone(), spec.stage);
        self.stop_where(|p| {
            p.spec.owner == owner && p.spec.stage == stage && p.finish_by.is_some() && p.child.is_some()
        });
        // The finished ones of this owner and stage are history now.
        self.processes.retain(|p| !(p.spec.owner == spec.owner && p.spec.stage == spec.stage && p.child.is_none()));
        let mut process = Process {
            spec,
            child: None,
            started: Instant::now(),
            restarts: 0,
            restart_at: None,
            probe: None,
            ended: None,
            after_stop: false,
            finish_by: None,
        };
        if self.stopping.iter().any(|s| s.owner == process.spec.owner && s.stage == process.spec.stage) {
            process.after_stop = true;
        } else {
            spawn(&mut process, self.reaper.as_mut());
        }
        self.processes.push(process);
    }

    /// The stage of `owner`'s `round` is done: its processes get `grace` to end by themselves,
    /// are stopped after that, and are not restarted (a worker that reports and lingers, or
    /// whose container would restart, does not outlive its stage).
    pub fn finish(&mut self, owner: &str, stage: Stage, round: u64, grace: Duration) {
        let by = Instant::now() + grace;
        let of_stage = |p: &&mut Process| p.spec.owner == owner && p.spec.stage == Some(stage) && p.spec.round == round;
        for process in self.processes.iter_mut().filter(of_stage) {
            process.spec.restart_policy = RestartPolicy::Never;
            process.restart_at = None;
            process.finish_by.get_or_insert(by);
        }
    }

    /// Reaps exited processes and restarts them by their policy. Returns the names of those that
    /// changed, for logging.
    pub fn poll(&mut self) -> Vec<String> {
        let now = Instant::now();
        self.stop_where(|p| p.child.is_some() && p.finish_by.is_some_and(|by| by <= now));
        self.follow_stopping();
        let mut changed = Vec::new();
        for process in &mut self.processes {
            if process.after_stop {
                let (owner, stage) = (&process.spec.owner, process.spec.stage);
                if !self.stopping.iter().any(|s| &s.owner == owner && s.stage == stage) {
                    process.after_stop = false;
                    spawn(process, self.reaper.as_mut());
                    changed.push(process.spec.name.clone());
                }
                continue;
            }
            if let Some(child) = &mut process.child {
                let Ok(Some(status)) = child.try_wait() else {
                    if let Some(probe) = &mut process.probe
                        && probe.poll(&process.spec.cwd, &process.spec.env)
                    {
                        changed.push(process.spec.name.clone());
                    }
                    continue;
                };
                // As a container ends with its main process: what it started goes with it.
                signal_group(child, libc::SIGKILL);
                if let Some(reaper) = &mut self.reaper {
                    reaper.ended(child.id());
                }
                process.child = None;
                let failed = !status.success();
                let restart = match process.spec.restart_policy {
                    RestartPolicy::Always => true,
                    RestartPolicy::OnFailure => failed,
                    RestartPolicy::Never => false,
                };
                if restart {
                    let delay = RESTART_DELAY.saturating_mul(1 << process.restarts.min(8)).min(RESTART_DELAY_MAX);
                    process.restart_at = Some(Instant::now() + delay);
                } else {
                    let phase = if failed { WorkerPhase::Failed } else { WorkerPhase::Succeeded };
                    process.ended = Some((phase, describe(status), Timestamp::now()));
                }
                changed.push(process.spec.name.clone());
            } else if process.restart_at.is_some_and(|at| at <= Instant::now()) {
                process.restart_at = None;
                process.restarts += 1;
                spawn(process, self.reaper.as_mut());
                changed.push(process.spec.name.clone());
            }
        }
        changed
    }

    /// The newest process of `owner` for `stage` and `round`, as the stage machine sees it.
    pub fn observe(&self, owner: &str, stage: Stage, round: u64) -> Option<WorkerObservation> {
        let process = self
            .processes
            .iter()
            .rev()
            .find(|p| p.spec.owner == owner && p.spec.stage == Some(stage) && p.spec.round == round)?;
        let (phase, detail, finished_at) = match &process.ended {
            Some((phase, detail, at)) => (*phase, Some(detail.clone()), Some(*at)),
            None if process.child.is_some() && process.probe.as_ref().is_none_or(ProbeState::ready) => {
                (WorkerPhase::Running, None, None)
            }
            None => (WorkerPhase::Pending, None, None),
        };
        Some(WorkerObservation {
            name: process.spec.name.clone(),
            stage,
            round,
            phase,
            restarts: process.restarts,
            node: Some("local".into()),
            finished_at,
            detail,
        })
    }

    /// Whether any process of `owner` (e.g. a plain pod) is alive or due to restart.
    pub fn is_running(&self, owner: &str) -> bool {
        self.processes
            .iter()
            .any(|p| p.spec.owner == owner && (p.child.is_some() || p.restart_at.is_some() || p.after_stop))
    }

    /// Stops the processes of `owner` for `stage` (all of the owner's with `None`): SIGTERM now,
    /// the rest in `poll`, without waiting.
    pub fn stop(&mut self, owner: &str, stage: Option<Stage>) {
        self.stop_where(|p| p.spec.owner == owner && (stage.is_none() || p.spec.stage == stage));
    }

    fn stop_where(&mut self, stops: impl Fn(&Process) -> bool) {
        let (stopped, kept): (Vec<Process>, Vec<Process>) =
            std::mem::take(&mut self.processes).into_iter().partition(|p| stops(p));
        self.processes = kept;
        let deadline = Instant::now() + STOP_GRACE;
        for process in stopped {
            if let Some(child) = process.child {
                signal_group(&child, libc::SIGTERM);
                let (owner, stage) = (process.spec.owner, process.spec.stage);
                self.stopping.push(Stopping { child, owner, stage, deadline });
            }
        }
    }

    /// Whether a stopped process is still ending.
    pub fn any_stopping(&self) -> bool {
        !self.stopping.is_empty()
    }

    /// Stops everything and waits for it (shutdown).
    pub fn stop_all(&mut self) {
        self.stop_where(|_| true);
        while !self.stopping.is_empty() {
            self.follow_stopping();
            if !self.stopping.is_empty() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Kills the group of each stopping process whose main process ended or whose grace is over.
    fn follow_stopping(&mut self) {
        let now = Instant::now();
        let reaper = &mut self.reaper;
        self.stopping.retain_mut(|stopping| {
            let ended = !matches!(stopping.child.try_wait(), Ok(None));
            if !ended && now < stopping.deadline {
                return true;
            }
            signal_group(&stopping.child, libc::SIGKILL);
            let _ = stopping.child.wait();
            if let Some(reaper) = reaper {
                reaper.ended(stopping.child.id());
            }
            false
        });
    }
}

impl Drop for LocalWorkers {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn spawn(process: &mut Process, reaper: Option<&mut Reaper>) {
    process.started = Instant::now();
    process.probe = process.spec.readiness.clone().map(|readiness| ProbeState::new(readiness, process.started));
    let spec = &process.spec;
    // With a reaper, it kills what is left if this process dies; without, the kernel does.
    match try_spawn(spec, reaper.is_none()) {
        Ok(child) => {
            if let Some(reaper) = reaper {
                reaper.started(child.id());
            }
            process.child = Some(child);
        }
        Err(err) => {
            let detail = format!("cannot start {:?} in {}: {err}", spec.program, spec.cwd.display());
            tracing::warn!(worker = spec.name, "{detail}");
            process.ended = Some((WorkerPhase::Failed, detail, Timestamp::now()));
        }
    }
}

/// Starts the process in a group of its own. Without `die_with_parent`, std starts it with
/// `posix_spawn` (no copy of this process's address space: a fork of a large process costs
/// milliseconds, and a hundred jobs start hundreds of workers a round).
fn try_spawn(spec: &ProcessSpec, die_with_parent: bool) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    if let Some(dir) = spec.log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&spec.log)?;
    let mut env: Vec<(String, std::ffi::OsString)> = ["PATH", "HOME", "LANG", "TZ"]
        .into_iter()
        .filter_map(|name| std::env::var_os(name).map(|value| (name.to_owned(), value)))
        .collect();
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.into())));
    let mut command = Command::new(program_path(&spec.program, &env, &spec.cwd)?);
    command.args(&spec.args).current_dir(&spec.cwd).env_clear().envs(env);
    command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // Its own group, so that stopping it stops what it started too.
    command.process_group(0);
    if die_with_parent {
        // SAFETY: between fork and exec the closure makes one syscall (prctl), async-signal-safe,
        // and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                // Die with the thread that started it (the embedded mode's controller thread,
                // which lives as long as the process).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    command.spawn()
}

/// A program without a `/` is looked up in the worker's own PATH (as a container's command is in
/// its image's), not this process's.
fn program_path(program: &str, env: &[(String, std::ffi::OsString)], cwd: &Path) -> std::io::Result<PathBuf> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let path = env.iter().rev().find(|(name, _)| name == "PATH").map(|(_, value)| value.clone());
    which::which_in(program, path, cwd)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::NotFound, format!("no {program:?} in the worker's PATH")))
}

fn signal_group(child: &Child, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else { return };
    // SAFETY: kill(2) with the negated pid of a group we created; no memory is involved.
    unsafe {
        libc::kill(-pid, signal);
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => "ended".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &std::path::Path, name: &str, script: &str, policy: RestartPolicy) -> ProcessSpec {
        ProcessSpec {
            owner: "default/job".into(),
            stage: Some(Stage::Train),
            round: 1,
            name: name.into(),
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            cwd: dir.to_owned(),
            env: vec![("GREETING".into(), "hello".into())],
            restart_policy: policy,
            log: dir.join(format!("{name}.log")),
            readiness: None,
        }
    }

    fn wait_for(workers: &mut LocalWorkers, done: impl Fn(&LocalWorkers) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(workers) {
            assert!(Instant::now() < deadline, "timed out");
            workers.poll();
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A process with a readiness probe is running (for the stage machine) only once the probe
    /// passes; one without is running as soon as it runs, as a container without a probe is
    /// Ready on Kubernetes.
    #[test]
    fn a_probed_process_is_running_only_when_its_probe_passes() {
        let dir = tempfile::tempdir().unwrap();
        let mut workers = LocalWorkers::new();
        let mut probed = spec(dir.path(), "probed", "sleep 30", RestartPolicy::Always);
        probed.stage = Some(Stage::Deploy);
        probed.readiness = Some(super::super::probe::Readiness {
            check: super::super::probe::Check::Exec(vec!["test".into(), "-f".into(), "ready".into()]),
            initial_delay: Duration::ZERO,
            period: Duration::from_millis(10),
            timeout: Duration::from_secs(1),
            success_threshold: 1,
        });
        workers.start(probed);
        workers.start(spec(dir.path(), "plain", "sleep 30", RestartPolicy::Always));
        let phase = |workers: &LocalWorkers, stage| workers.observe("default/job", stage, 1).map(|o| o.phase);
        assert_eq!(phase(&workers, Stage::Train), Some(WorkerPhase::Running), "no probe: running at once");
        for _ in 0..20 {
            workers.poll();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(phase(&workers, Stage::Deploy), Some(WorkerPhase::Pending), "the probe fails: not yet");
        std::fs::write(dir.path().join("ready"), "").unwrap();
        wait_for(&mut workers, |w| phase(w, Stage::Deploy) == Some(WorkerPhase::Running));
        workers.stop_all();
    }

    #[test]
    fn env_output_and_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let mut workers = LocalWorkers::new();
        workers.start(spec(dir.path(), "ok", "echo $GREETING from $(pwd); echo oops >&2", RestartPolicy::Never));
        wait_for(&mut workers, |w| w.observe("default/job", Stage::Train, 1).unwrap().phase != WorkerPhase::Running);
        let seen = workers.observe("default/job", Stage::Train, 1).unwrap();
        assert_eq!(seen.phase, WorkerPhase::Succeeded);
        let log = std::fs::read_to_string(dir.path().join("ok.log")).unwrap();
        let cwd = dir.path().canonicalize().unwrap();
        assert_eq!(log, format!("hello from {}\noops\n", cwd.display()));

        workers.start(spec(dir.path(), "bad", "exit 3", RestartPolicy::Never));
        wait_for(&mut workers, |w| w.observe("default/job", Stage::Train, 1).unwrap().phase == WorkerPhase::Failed);
        let seen = workers.observe("default/job", Stage::Train, 1).unwrap();
        assert_eq!(seen.detail.as_deref(), Some("exit code 3"));
        assert!(seen.finished_at.is_some());
    }

    #[test]
    fn a_missing_program_is_a_failed_worker_with_the_cause() {
        let dir = tempfile::tempdir().unwrap();
        let mut workers = LocalWorkers::new();
        let mut missing = spec(dir.path(), "missing", "", RestartPolicy::OnFailure);
        missing.program = "no-such-program-perennial".into();
        workers.start(missing);
        let seen = workers.observe("default/job", Stage::Train, 1).unwrap();
        assert_eq!(seen.phase, WorkerPhase::Failed);
        assert!(seen.detail.unwrap().contains("cannot start \"no-such-program-perennial\""));
    }

    #[test]
    fn on_failure_restarts_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut workers = LocalWorkers::new();
        workers.start(spec(dir.path(), "crash", "exit 1", RestartPolicy::OnFailure));
        wait_for(&mut workers, |w| w.observe("default/job", Stage::Train, 1).unwrap().restarts >= 2);
        let seen = workers.observe("default/job", Stage::Train, 1).unwrap();
        assert_ne!(seen.phase, WorkerPhase::Failed, "OnFailure keeps restarting; the machine judges the loop");
    }

    #[test]
    fn a_stop_does_not_wait_and_a_successor_waits_for_its_predecessor() {
        let dir = tempfile::tempdir().unwrap();
        let mut workers = LocalWorkers::new();
        // Takes 300 ms to end after SIGTERM, and says when it did.
        let ended = dir.path().join("ended");
        let slow = format!(
            "trap 'sleep 0.3; touch {}; exit 0' TERM; touch started; while :; do sleep 0.02; done",
            ended.display()
        );
        workers.start(spec(dir.path(), "slow", &slow, RestartPolicy::Always));
        wait_for(&mut workers, |_| dir.path().join("started").exists());
        let stopped = Instant::now();
        workers.stop("default/job", Some(Stage::Train));
        assert!(stopped.elapsed() < Duration::from_millis(100), "the stop waited {:?}", stopped.elapsed());
        // Its successor (same owner and stage) starts only once it has ended.
        let successor = format!("test -e {} && touch successor-saw-it; sleep 60", ended.display());
        workers.start(spec(dir.path(), "next", &successor, RestartPolicy::Always));
        assert_eq!(workers.observe("default/job", Stage::Train, 1).unwrap().phase, WorkerPhase::Pending);
        // Another stage is not held by it.
        let mut eval = spec(dir.path(), "eval", "sleep 60", RestartPolicy::Always);
        eval.stage = Some(Stage::Eval);
        workers.start(eval);
        assert_eq!(workers.observe("default/job", Stage::Eval, 1).unwrap().phase, WorkerPhase::Running);
        wait_for(&mut workers, |w| w.observe("default/job", Stage::Train, 1).unwrap().phase == WorkerPhase::Running);
        assert!(!workers.any_stopping());
        wait_for(&mut workers, |_| dir.path().join("successor-saw-it").exists());
        workers.stop_all();
    }

    #[test]
    fn stop_ends_the_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let mut workers = LocalWorkers::new();
        // A shell that starts a grandchild: stopping the worker must stop both.
        let pid_file = dir.path().join("grandchild.pid");
        let script = format!("sleep 60 & echo $! > {}; wait", pid_file.display());
        workers.start(spec(dir.path(), "tree", &script, RestartPolicy::Always));
        wait_for(&mut workers, |_| pid_file.exists() && std::fs::read_to_string(&pid_file).unwrap().ends_with('\n'));
        let grandchild: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
        let started = Instant::now();
        workers.stop("default/job", Some(Stage::Train));
        assert!(started.elapsed() < STOP_GRACE, "SIGTERM was enough");
        assert!(workers.observe("default/job", Stage::Train, 1).is_none());
        // SAFETY: signal 0 only checks whether the pid exists (a zombie is reaped by init soon).
        let gone = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            (unsafe { libc::kill(grandchild, 0) }) != 0
        });
        assert!(gone, "the grandchild {grandchild} outlived its worker");
    }
}
