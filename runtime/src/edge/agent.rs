//! The edge agent's job loop: one thread per job, woken by a change notification on the dataset
//! index (the `notify` crate), by a slow stat fallback, and by the trigger's recheck time. Each
//! wake-up ingests what is new, then does what the job's stage asks (rounds.rs).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use notify::{RecursiveMode, Watcher};
use serde::{Deserialize, Serialize};

use super::index_file::IndexFile;
use super::ingest::{FileState, IngestLimits, Split, ingest};
use super::jobs::JobSpec;
use super::rounds::{self, Clock, Index, Outcome, OutputDir};
use crate::policy::{
    PolicyEvents, PolicyHost, PolicyRef, SelectorPolicy, SplitterPolicy, TracingEvents, TriggerPolicy,
};
use crate::store::Store;

/// What the edge needs to run one job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobConfig {
    /// `namespace/name`.
    pub name: String,
    pub uid: String,
    pub spec: JobSpec,
    /// The splitter; absent: Sedna's `trainProb` rule, computed natively.
    #[serde(default)]
    pub splitter: Option<PolicyRef>,
    pub trigger: PolicyRef,
    #[serde(default = "first_select")]
    pub selector: PolicyRef,
}

fn first_select() -> PolicyRef {
    PolicyRef::new("builtin:first-select")
}

/// How the loop waits.
#[derive(Clone, Copy, Debug)]
pub struct LoopSettings {
    /// The stat fallback: look at the index at least this often, events or not.
    pub poll: Duration,
    pub limits: IngestLimits,
    pub utc_offset_secs: i32,
}

impl Default for LoopSettings {
    fn default() -> Self {
        LoopSettings { poll: Duration::from_secs(2), limits: IngestLimits::default(), utc_offset_secs: 0 }
    }
}

/// A job's loaded policies.
pub struct JobPolicies {
    pub splitter: Option<SplitterPolicy>,
    pub trigger: TriggerPolicy,
    pub selector: SelectorPolicy,
}

impl JobPolicies {
    /// Drops the live instances; the next call makes fresh ones (tens of microseconds). An idle
    /// job then holds compiled code shared with every other job, and no instance memory.
    pub fn release(&self) {
        if let Some(splitter) = &self.splitter {
            splitter.reset();
        }
        self.trigger.reset();
        self.selector.reset();
    }
}

/// Loads a job's policies.
pub async fn load_policies(host: &PolicyHost, job: &JobConfig) -> Result<JobPolicies, crate::policy::LoadError> {
    let events: Arc<dyn PolicyEvents> = Arc::new(TracingEvents { job: job.name.clone() });
    let splitter = match &job.splitter {
        Some(reference) => Some(host.load(reference, events.clone()).await?),
        None => None,
    };
    Ok(JobPolicies {
        splitter,
        trigger: host.load(&job.trigger, events.clone()).await?,
        selector: host.load(&job.selector, events).await?,
    })
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Runs the job's loop on the calling thread until `stop` is set. `index` reads the job's
/// dataset index; `output` is the blocking operator over the job's output directory.
pub fn run_job(
    store: &Mutex<Store>,
    job: &JobConfig,
    policies: &JobPolicies,
    index: &mut dyn IndexFile,
    output: &opendal::blocking::Operator,
    settings: LoopSettings,
    stop: &AtomicBool,
) {
    let (wake, woken) = mpsc::channel::<()>();
    // A watcher on a local index's folder (the file may not exist yet, or be replaced); an S3
    // index is only polled.
    let _watcher =
        (!job.spec.dataset_url.contains("://")).then(|| watch(Path::new(&job.spec.dataset_url), wake.clone()));
    let csv = job.spec.dataset_format.eq_ignore_ascii_case("csv");
    let mut missing_said = false;
    while !stop.load(Ordering::Relaxed) {
        let mut recheck = settings.poll;
        {
            let mut store = store.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let split = Split { policy: policies.splitter.as_ref(), train_prob: job.spec.train_prob };
            match ingest(&mut store, &job.name, index, csv, &split, settings.limits) {
                Ok(done) => {
                    match (&done.state, missing_said) {
                        (FileState::Missing, false) => {
                            tracing::warn!(job = job.name, "waiting for the dataset index {}", index.name());
                            missing_said = true;
                        }
                        (FileState::Present, _) => missing_said = false,
                        _ => {}
                    }
                    for refused in &done.refused {
                        tracing::warn!(job = job.name, "refused: {refused}");
                    }
                    if let Some(why) = &done.restarted {
                        tracing::warn!(job = job.name, "{why}");
                    }
                    if let Some(err) = &done.fell_back {
                        tracing::warn!(job = job.name, "splitter failed, Sedna's rule decided: {err}");
                    }
                    if done.samples > 0 {
                        tracing::debug!(job = job.name, samples = done.samples, "ingested");
                    }
                }
                Err(err) => tracing::error!(job = job.name, "ingest: {err}"),
            }
            let clock = Clock { now: now(), utc_offset_secs: settings.utc_offset_secs };
            let mut index = Index { file: index, csv, url: &job.spec.dataset_url, max_line: settings.limits.max_line };
            let out = OutputDir { url: &job.spec.output_dir, op: output };
            let stage = stage(&store, &job.name);
            let outcome = match stage.as_ref().map(|(s, p)| (s.as_str(), p.as_str())) {
                Some(("Train", "Waiting")) => {
                    rounds::train_waiting(&mut store, &job.name, &mut index, &out, &policies.trigger, clock)
                }
                Some(("Eval", "Waiting")) => rounds::eval_waiting(&mut store, &job.name, &mut index, &out, clock),
                Some(("Deploy", "Waiting")) => {
                    let read = |url: &str| read_local(url);
                    rounds::deploy_waiting(&mut store, &job.name, &out, &read, &policies.selector, clock)
                }
                _ => Ok(Outcome::Waiting { reason: "no edge step in this stage".into(), recheck_after_secs: None }),
            };
            match outcome {
                Ok(Outcome::Reported(report)) => {
                    tracing::info!(job = job.name, round = report.round, "{} {}", report.phase, report.status);
                }
                Ok(Outcome::Waiting { recheck_after_secs: Some(secs), .. }) => {
                    recheck = recheck.min(Duration::from_secs(secs));
                }
                Ok(Outcome::Waiting { .. }) => {}
                Err(err) => tracing::error!(job = job.name, "{err}"),
            }
        }
        policies.release();
        match woken.recv_timeout(recheck) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(recheck),
        }
        // Coalesce a burst of events into one pass.
        while woken.try_recv().is_ok() {}
    }
}

fn stage(store: &Store, job: &str) -> Option<(String, String)> {
    store.conn().query_row("SELECT stage, phase FROM jobs WHERE name = ?1", [job], |r| Ok((r.get(0)?, r.get(1)?))).ok()
}

fn read_local(url: &str) -> Result<Vec<u8>, String> {
    std::fs::read(url).map_err(|err| format!("{url}: {err}"))
}

fn watch(index: &Path, wake: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    let folder = index.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = index.file_name().map(|n| n.to_os_string());
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && event.paths.iter().any(|p| p.file_name().map(|n| n.to_os_string()) == name)
        {
            let _ = wake.send(());
        }
    })
    .ok()?;
    match watcher.watch(folder, RecursiveMode::NonRecursive) {
        Ok(()) => Some(watcher),
        Err(err) => {
            // The stat fallback still sees the file grow.
            tracing::warn!("cannot watch {}: {err}; polling instead", folder.display());
            None
        }
    }
}
