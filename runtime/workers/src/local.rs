//! The embedded mode's workers: local processes, as a kubelet would run the pods. Each runs in
//! its own process group with its output appended to a log file; it is restarted by its
//! restart policy with a growing delay (counted, so that the stage machine sees a crash loop);
//! it dies with Perennial (`PR_SET_PDEATHSIG`), so a killed `perennial run` leaves no orphan that
//! could report twice; and it is stopped with SIGTERM, then SIGKILL after a grace period.

use std::path::PathBuf;
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
    /// Told of every worker group, so that none outlives the run.
    reaper: Option<Reaper>,
}

impl LocalWorkers {
    pub fn new() -> Self {
        LocalWorkers::default()
    }

    /// Workers whose groups `reaper` kills if the run ends without stopping them (kill -9).
    pub fn with_reaper(reaper: Option<Reaper>) -> Self {
        LocalWorkers { processes: Vec::new(), reaper }
    }

    /// Starts a process. A process that cannot be started (no such program) is recorded as
    /// failed, with the cause, for the stage machine to see.
    pub fn start(&mut self, spec: ProcessSpec) {
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
        };
        spawn(&mut process, self.reaper.as_mut());
        self.processes.push(process);
    }

    /// Reaps exited processes and restarts them by their policy. Returns the names of those that
    /// changed, for logging.
    pub fn poll(&mut self) -> Vec<String> {
        let mut changed = Vec::new();
        for process in &mut self.processes {
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
        self.processes.iter().any(|p| p.spec.owner == owner && (p.child.is_some() || p.restart_at.is_some()))
    }

    /// Stops the processes of `owner` for `stage` (all of the owner's with `None`).
    pub fn stop(&mut self, owner: &str, stage: Option<Stage>) {
        let (stopping, kept): (Vec<Process>, Vec<Process>) = std::mem::take(&mut self.processes)
            .into_iter()
            .partition(|p| p.spec.owner == owner && (stage.is_none() || p.spec.stage == stage));
        self.processes = kept;
        terminate(stopping, self.reaper.as_mut());
    }

    /// Stops everything (shutdown).
    pub fn stop_all(&mut self) {
        terminate(std::mem::take(&mut self.processes), self.reaper.as_mut());
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
    match try_spawn(spec) {
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

fn try_spawn(spec: &ProcessSpec) -> std::io::Result<Child> {
    if let Some(dir) = spec.log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&spec.log)?;
    let mut command = Command::new(&spec.program);
    command.args(&spec.args).current_dir(&spec.cwd).env_clear();
    for name in ["PATH", "HOME", "LANG", "TZ"] {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command.envs(spec.env.iter().map(|(k, v)| (k, v)));
    command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec the closure makes two syscalls (setpgid, prctl), both
        // async-signal-safe, and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                // Its own group, so that stopping it stops what it started too.
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
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

/// SIGTERM to each process group, then SIGKILL to each group once its main process has ended
/// or the grace period is over (nothing of a stopped worker lives on).
fn terminate(processes: Vec<Process>, mut reaper: Option<&mut Reaper>) {
    let mut children: Vec<Child> = processes.into_iter().filter_map(|p| p.child).collect();
    for child in &children {
        signal_group(child, libc::SIGTERM);
    }
    let deadline = Instant::now() + STOP_GRACE;
    let mut ended = Vec::new();
    while !children.is_empty() && Instant::now() < deadline {
        let mut running = Vec::new();
        for mut child in children {
            match child.try_wait() {
                Ok(None) => running.push(child),
                _ => ended.push(child),
            }
        }
        children = running;
        if !children.is_empty() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for mut child in children.into_iter().chain(ended) {
        signal_group(&child, libc::SIGKILL);
        let _ = child.wait();
        if let Some(reaper) = reaper.as_deref_mut() {
            reaper.ended(child.id());
        }
    }
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
