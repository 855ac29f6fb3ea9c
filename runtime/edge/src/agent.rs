//! The edge agent's job loop: one thread for all jobs, a job woken by a change notification on
//! its dataset index (the `notify` crate), by a slow stat fallback, and by its trigger's recheck
//! time. Each turn ingests a batch of what is new, then does what the job's stage asks
//! (rounds.rs).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use notify::{RecursiveMode, Watcher};

use super::decisions::DecisionKind;
use super::faults::{Faults, Say, Site};
use super::health;
use super::index_file::IndexFile;
use super::ingest::IngestError;
use super::ingest::{FileState, IngestLimits, Split, ingest};
use super::model_copy::ModelCopier;
use super::rounds::RoundError;
use super::rounds::{self, Clock, Index, Outcome, OutputDir};
use super::shadow::{self, Question, ShadowQueue, Shadows};
use crate::sqlite::{Store, lock};
use perennial_policy::{
    Kind, OnError, Policy, PolicyEvents, PolicyHost, PolicyRef, SelectorPolicy, Source, SplitterPolicy, TracingEvents,
    TriggerPolicy,
};

pub use perennial_types::JobConfig;
use perennial_types::{Phase, PolicyArtifact, Stage};

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
    /// The built-in rules failing policies fall back to (`onError: fallback`).
    pub fallback_trigger: Option<TriggerPolicy>,
    pub fallback_selector: Option<SelectorPolicy>,
    /// The candidates running beside them (`shadow:` in a reference), and the ones that could
    /// not be loaded with why (the job runs all the same).
    pub shadows: Shadows,
    pub shadows_refused: Vec<RefusedShadow>,
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
        if let Some(trigger) = &self.fallback_trigger {
            trigger.reset();
        }
        if let Some(selector) = &self.fallback_selector {
            selector.reset();
        }
        // Not the shadows: one may be in a call on its own thread, and the loop never waits
        // for it; that thread releases them when it is idle.
    }
}

/// A shadow that could not be loaded: its kind, its plugin, why.
pub type RefusedShadow = (DecisionKind, String, String);

/// Loads the shadows the job's references name; one that does not load is left out, with why.
async fn load_shadows(
    host: &PolicyHost,
    job: &JobConfig,
    events: Arc<dyn PolicyEvents>,
) -> (Shadows, Vec<RefusedShadow>) {
    let mut shadows = Shadows { job: job.name.as_str().into(), ..Shadows::default() };
    let mut refused = Vec::new();
    let mut note = |kind: DecisionKind, plugin: &str, err: perennial_policy::LoadError| {
        tracing::warn!(job = job.name, "the {kind} shadow {plugin} was not loaded: {err}");
        refused.push((kind, plugin.to_owned(), err.to_string()));
    };
    if let Some(shadow) = &job.trigger.shadow {
        match load_ref(host, job, &shadow.as_policy(), events.clone()).await {
            Ok(policy) => shadows.trigger = Some(Arc::new(policy)),
            Err(err) => note(DecisionKind::Trigger, &shadow.plugin, err),
        }
    }
    if let Some(shadow) = job.splitter.as_ref().and_then(|s| s.shadow.as_ref()) {
        match load_ref(host, job, &shadow.as_policy(), events.clone()).await {
            Ok(policy) => shadows.splitter = Some(Arc::new(policy)),
            Err(err) => note(DecisionKind::Splitter, &shadow.plugin, err),
        }
    }
    if let Some(shadow) = &job.selector.shadow {
        match load_ref(host, job, &shadow.as_policy(), events).await {
            Ok(policy) => shadows.selector = Some(Arc::new(policy)),
            Err(err) => note(DecisionKind::Selector, &shadow.plugin, err),
        }
    }
    (shadows, refused)
}

/// The shadow references of a job, to tell whether an edit changed them.
fn shadow_refs(job: &JobConfig) -> [Option<&perennial_types::ShadowRef>; 3] {
    [job.trigger.shadow.as_ref(), job.splitter.as_ref().and_then(|s| s.shadow.as_ref()), job.selector.shadow.as_ref()]
}

/// Loads a policy of `job`: from the artifact the operator compiled for this node when it offers
/// one, else from the reference (compiled here). While the operator compiles, or when it cannot
/// and this agent has no compiler, the load fails with why, and the previous policy serves on.
async fn load_ref<K: Kind>(
    host: &PolicyHost,
    job: &JobConfig,
    reference: &PolicyRef,
    events: Arc<dyn PolicyEvents>,
) -> Result<Policy<K>, perennial_policy::LoadError> {
    load_saying::<K>(host, job, reference, events, &|_| {}).await
}

/// [`load_ref`], saying what loads before the long part (a compile of a Python policy takes
/// many seconds): `say(digest)` at the start with the reference's pin (or nothing), and again
/// with the component's digest once fetched.
async fn load_saying<K: Kind>(
    host: &PolicyHost,
    job: &JobConfig,
    reference: &PolicyRef,
    events: Arc<dyn PolicyEvents>,
    say: &(dyn Fn(&str) + Send + Sync),
) -> Result<Policy<K>, perennial_policy::LoadError> {
    use perennial_policy::{LoadError, PolicyError, Step, artifact};
    let not_yet =
        |message: String| LoadError::new(Step::Fetch, PolicyError::Fetch { plugin: reference.plugin.clone(), message });
    match job.policy_artifacts.get(&reference.plugin) {
        Some(PolicyArtifact::Ready { component_sha256, artifact_sha256, size, .. }) => {
            say(component_sha256);
            host.load_offered(reference, (component_sha256, artifact_sha256, *size), events).await
        }
        Some(PolicyArtifact::Compiling { platform }) => {
            Err(not_yet(format!("the operator is compiling it for this node ({platform}); it loads once compiled")))
        }
        Some(PolicyArtifact::Refused { reason }) if !perennial_policy::HAS_COMPILER => {
            Err(not_yet(format!("the operator cannot compile it for this node: {reason}")))
        }
        _ => {
            let valid =
                reference.validate().map_err(|err| LoadError::new(Step::Reference, PolicyError::Reference(err)))?;
            say(valid.sha256.as_deref().unwrap_or_default());
            // What the fetch says (a registry down, a kept copy serving) names the job.
            let span = tracing::info_span!("policy", job = %job.name);
            let bytes =
                tracing::Instrument::instrument(host.fetch_ref_for_job(&valid, &job.registry_auth), span).await?;
            // A precompiled artifact's own digest is not the component's: said once loaded.
            if !artifact::is_artifact(&bytes) {
                say(&artifact::sha256_hex(&bytes));
            }
            host.load_fetched(valid, bytes, events).await
        }
    }
}

/// Whether what the operator sends for `plugin` differs between two versions of a job: its offer,
/// or, for an `oci://` one, the job's login for its registry (a Secret made or fixed since: a
/// load refused for want of it is tried again).
fn offer_changed(current: &JobConfig, next: &JobConfig, plugin: &str) -> bool {
    let login_changed = match perennial_policy::parse_source(plugin) {
        Ok(Source::Oci(oci)) => {
            let login = |job: &JobConfig| job.registry_auth.login(&oci.registry).cloned();
            // Not the problems: they change only what a refusal says.
            login(current) != login(next)
        }
        _ => false,
    };
    login_changed || current.policy_artifacts.get(plugin) != next.policy_artifacts.get(plugin)
}

/// A reference without its shadow: what the serving policy is.
fn serving_ref(reference: &PolicyRef) -> PolicyRef {
    PolicyRef { shadow: None, ..reference.clone() }
}

/// Loads a job's policies.
pub async fn load_policies(host: &PolicyHost, job: &JobConfig) -> Result<JobPolicies, PolicyLoadError> {
    let events: Arc<dyn PolicyEvents> = Arc::new(TracingEvents { job: job.name.clone() });
    let failed = |kind: &'static str| move |err| PolicyLoadError { kind, fallback: false, error: err };
    let splitter = match &job.splitter {
        Some(reference) => Some(load_ref(host, job, reference, events.clone()).await.map_err(failed("splitter"))?),
        None => None,
    };
    let trigger = load_ref(host, job, &job.trigger, events.clone()).await.map_err(failed("trigger"))?;
    let fallback_trigger = match &job.fallback_trigger {
        Some(reference) if job.trigger.on_error == OnError::Fallback => {
            let fallback = |err| PolicyLoadError { kind: "trigger", fallback: true, error: err };
            load_fallback(host, job, reference, events.clone()).await.map_err(fallback)?
        }
        _ => None,
    };
    let selector = load_ref(host, job, &job.selector, events.clone()).await.map_err(failed("selector"))?;
    let fallback_selector = if wants_fallback_selector(job) {
        let sedna_selector = PolicyRef::new(SEDNA_SELECTOR);
        load_fallback(host, job, &sedna_selector, events.clone()).await.map_err(failed("selector"))?
    } else {
        None
    };
    // A shadow that cannot load is reported on the job's status; it never stops the job.
    let (shadows, shadows_refused) = load_shadows(host, job, events).await;
    Ok(JobPolicies { splitter, trigger, selector, fallback_trigger, fallback_selector, shadows, shadows_refused })
}

/// Sedna's selector: the fallback of a selector that fails (`onError: fallback`).
const SEDNA_SELECTOR: &str = "builtin:first-select";

/// Whether the job's selector needs Sedna's beside it: it falls back, and is not Sedna's itself.
fn wants_fallback_selector(job: &JobConfig) -> bool {
    job.selector.on_error == OnError::Fallback && job.selector.plugin != SEDNA_SELECTOR
}

/// Sedna's rule for a kind, which decides when the job's own policy fails. A compiler-free
/// agent has no built-ins to run it with (they run precompiled, when a job names them): the job
/// then goes without it, and a failing policy holds the job rather than stopping the agent.
async fn load_fallback<K: Kind>(
    host: &PolicyHost,
    job: &JobConfig,
    reference: &PolicyRef,
    events: Arc<dyn PolicyEvents>,
) -> Result<Option<Policy<K>>, perennial_policy::LoadError> {
    let builtin = reference.plugin.starts_with("builtin:");
    match load_ref(host, job, reference, events).await {
        Ok(policy) => Ok(Some(policy)),
        Err(err) if builtin && !perennial_policy::HAS_COMPILER && err.step == perennial_policy::Step::Fetch => {
            tracing::warn!(
                job = job.name,
                "no fallback {}: this compiler-free agent has no built-ins; if the job's {} fails, the job holds",
                reference.plugin,
                K::NAME
            );
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// A policy of a job that cannot serve: its kind (`splitter`, `trigger`, `selector`) and why.
#[derive(Debug, thiserror::Error)]
#[error("{}{error}", if *.fallback { "its fallback: " } else { "" })]
pub struct PolicyLoadError {
    pub kind: &'static str,
    /// The fallback policy of that kind (Sedna's rule) failed.
    pub fallback: bool,
    /// Not a `source`: its text is this error's own, said once in a chain.
    pub error: perennial_policy::LoadError,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Everything one job needs to run on this node.
pub struct JobRunner {
    pub job: JobConfig,
    pub policies: JobPolicies,
    /// The job's dataset index (local or S3).
    pub index: Box<dyn IndexFile + Send>,
    /// The job's output directory.
    pub output: opendal::blocking::Operator,
    /// Copies a model a worker reported (a path or an `s3://` URL) into the output directory, to
    /// deploy it ([`model_copier`](crate::model_copy::model_copier)).
    pub copy_model: ModelCopier,
    pub settings: LoopSettings,
}

/// Longest wait between two looks at `stop`.
const STOP_CHECK: Duration = Duration::from_millis(500);

/// Runs every job on the calling thread until `stop` is set: one thread and one change watcher
/// for all jobs, so that a hundred idle jobs cost little. A job runs when its index changes,
/// when its trigger's recheck time or its stat-fallback time comes, and again right away while
/// it has a backlog (one batch per turn, so that no job holds up the others).
pub fn run_jobs(
    store: &Mutex<Store>,
    jobs: &mut Vec<JobRunner>,
    stop: &AtomicBool,
    wakes: Wakes,
    reported: &dyn Fn(),
    swapper: Option<&Swapper>,
) {
    // A load under way when the agent stopped never ends: none is, at the start.
    if let Err(err) = health::clear_loading(&mut lock(store)) {
        tracing::warn!("clearing the policies' loads of the last run: {err}");
    }
    // The shadows' own thread: the loop hands it questions and never waits for its answers.
    let (shadows, worker) = shadow::queue();
    std::thread::scope(|scope| {
        scope.spawn(|| worker.serve(store));
        run_loop(store, jobs, stop, wakes, reported, swapper, &shadows);
        drop(shadows);
    });
}

fn run_loop(
    store: &Mutex<Store>,
    jobs: &mut Vec<JobRunner>,
    stop: &AtomicBool,
    wakes: Wakes,
    reported: &dyn Fn(),
    swapper: Option<&Swapper>,
    shadows: &ShadowQueue,
) {
    let Wakes { sender: waker, receiver: woken } = wakes;
    let mut watch = IndexWatch::new(waker.clone());
    for (i, runner) in jobs.iter().enumerate() {
        watch.add(i, runner.index.as_ref());
    }
    let mut due = vec![Instant::now(); jobs.len()];
    let mut faults: Vec<Faults> = jobs.iter().map(|_| Faults::default()).collect();
    let mut removed = vec![false; jobs.len()];
    // Each job's latest swap, by number: a load that finishes after a newer one was asked for
    // is dropped (the newer one brings what it should).
    let mut swaps_asked = vec![0u64; jobs.len()];
    let mut plugin_files: Vec<PluginFiles> = jobs.iter().map(|runner| PluginFiles::of(&runner.job)).collect();
    let mut files_looked = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        shadows.loop_busy();
        for (i, runner) in jobs.iter_mut().enumerate() {
            if due[i] > Instant::now() || stop.load(Ordering::Relaxed) || removed[i] {
                continue;
            }
            let (recheck, more, report) = turn(store, runner, &mut faults[i], shadows);
            if report {
                reported();
            }
            due[i] = if more { Instant::now() } else { Instant::now() + recheck };
            if !more {
                runner.policies.release();
            }
        }
        flush_records(store, false);
        watch.retry();
        let next = due
            .iter()
            .zip(&removed)
            .filter(|(_, gone)| !**gone)
            .map(|(due, _)| *due)
            .min()
            .unwrap_or_else(|| Instant::now() + STOP_CHECK);
        let wait = next.saturating_duration_since(Instant::now()).min(STOP_CHECK);
        let mut wakes = Vec::new();
        // The shadows answer while the loop waits, never beside a turn.
        shadows.loop_waits();
        match woken.recv_timeout(wait) {
            Ok(wake) => wakes.push(wake),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(wait),
        }
        shadows.loop_busy();
        // Coalesce a burst of events; in order, so that a job added in it can be woken in it.
        wakes.extend(woken.try_iter());
        // A plugin file rebuilt under the same reference swaps like an edit (the author's loop).
        let mut reloads = Vec::new();
        if files_looked.elapsed() >= PLUGIN_FILE_CHECK {
            files_looked = Instant::now();
            for (i, files) in plugin_files.iter_mut().enumerate() {
                if !removed[i] && files.changed() {
                    reloads.push(i);
                }
            }
        }
        for wake in wakes {
            match wake {
                Wake::Add(runner) => {
                    // A job from the link: its index is watched like the others'.
                    watch.add(jobs.len(), runner.index.as_ref());
                    plugin_files.push(PluginFiles::of(&runner.job));
                    jobs.push(*runner);
                    due.push(Instant::now());
                    faults.push(Faults::default());
                    removed.push(false);
                    swaps_asked.push(0);
                }
                Wake::Job(i) if i < due.len() => due[i] = Instant::now(),
                Wake::JobNamed(name) => {
                    let running = (0..jobs.len()).rev().find(|&i| !removed[i] && jobs[i].job.name == name);
                    if let Some(i) = running {
                        due[i] = Instant::now();
                    }
                }
                Wake::Remove(i) if i < due.len() => {
                    removed[i] = true;
                    watch.remove(i);
                }
                Wake::Swap(i, config) if i < due.len() => {
                    if let (Some(swapper), Some(runner)) = (swapper, jobs.get_mut(i)) {
                        // Sedna reads trainProb live; so does the split (the fallback rule
                        // included). The eval set's size applies from the next eval set on.
                        runner.job.spec.train_prob = config.spec.train_prob;
                        runner.job.spec.eval_set_size = config.spec.eval_set_size;
                        // Its records' bound is read from the stored spec.
                        if runner.job.spec.decision_records != config.spec.decision_records {
                            runner.job.spec.decision_records = config.spec.decision_records;
                            let mut store = lock(store);
                            let job = &runner.job;
                            if let Err(err) = crate::register_job(&mut store, &job.name, &job.uid, &job.spec) {
                                tracing::warn!(job = job.name, "recording the job's decisionRecords: {err}");
                            }
                        }
                        plugin_files[i] = PluginFiles::of(&config);
                        swaps_asked[i] += 1;
                        // Policy files are read again too: an edit overtakes a reload in flight.
                        swapper.start(i, swaps_asked[i], &runner.job, *config, true, waker.clone());
                        due[i] = Instant::now();
                    }
                }
                // Between two turns: no call is under way, so no sample is decided by both.
                Wake::Loaded(i, asked, loaded) if i < due.len() && asked == swaps_asked[i] && !removed[i] => {
                    commit(store, &mut jobs[i], *loaded);
                    due[i] = Instant::now();
                }
                Wake::Loading(i, asked, kind, plugin, digest)
                    if i < due.len() && asked == swaps_asked[i] && !removed[i] =>
                {
                    let job = &jobs[i].job.name;
                    if let Err(err) = health::loading(&mut lock(store), job, kind, &plugin, &digest, now()) {
                        tracing::warn!(job, "recording the {kind} policy loading: {err}");
                    }
                }
                Wake::Job(_) | Wake::Remove(_) | Wake::Swap(..) | Wake::Loaded(..) | Wake::Loading(..) => {}
            }
        }
        for i in reloads {
            if let (Some(swapper), Some(runner)) = (swapper, jobs.get(i)) {
                tracing::info!(job = runner.job.name, "a policy file changed: loading it again");
                swaps_asked[i] += 1;
                swapper.start(i, swaps_asked[i], &runner.job, runner.job.clone(), true, waker.clone());
            }
        }
    }
    flush_records(store, true);
}

/// Writes the trigger waits held in memory: when they are due, or all (`at_end`).
fn flush_records(store: &Mutex<Store>, at_end: bool) {
    let mut store = lock(store);
    let flushed = if at_end { store.flush_records() } else { store.flush_records_if_due() };
    if let Err(err) = flushed {
        tracing::warn!("recording the triggers' waits: {err}");
    }
}

/// How often the loop looks at the files of `file://` policies.
pub const PLUGIN_FILE_CHECK: Duration = Duration::from_secs(1);

/// The policy files of a job and what they were when last looked at (size, modification time).
struct PluginFiles {
    files: Vec<(PathBuf, Option<(u64, SystemTime)>)>,
}

impl PluginFiles {
    fn of(job: &JobConfig) -> Self {
        let references = [Some(&job.trigger), Some(&job.selector), job.splitter.as_ref()];
        let files = references
            .into_iter()
            .flatten()
            .filter_map(|reference| match perennial_policy::parse_source(&reference.plugin) {
                Ok(Source::File(path)) => Some(path),
                _ => None,
            })
            .map(|path| {
                let stamp = stamp(&path);
                (path, stamp)
            })
            .collect();
        PluginFiles { files }
    }

    /// Whether a file changed since the last look (a file that went away is no change: the
    /// serving policy serves on).
    fn changed(&mut self) -> bool {
        let mut changed = false;
        for (path, known) in &mut self.files {
            let now = stamp(path);
            if now.is_some() && now != *known {
                changed = true;
            }
            *known = now.or(*known);
        }
        changed
    }
}

fn stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

/// What a hot swap needs: the policy host, a runtime to load on, and the limit on loads at once.
/// A swap loads off the job loop, so that a compile (seconds for a Python component) never
/// holds up any job's decisions; the job's serving policies serve until the new ones are ready.
pub struct Swapper {
    host: PolicyHost,
    runtime: tokio::runtime::Handle,
    loads: Arc<tokio::sync::Semaphore>,
}

/// Policy loads (fetch, verify, compile, configure) that may run at once: a compile takes a
/// core and, at its peak, hundreds of MB (a Python component) until it ends.
pub const CONCURRENT_LOADS: usize = 1;

impl Swapper {
    pub fn new(host: PolicyHost, runtime: tokio::runtime::Handle) -> Self {
        Swapper { host, runtime, loads: Arc::new(tokio::sync::Semaphore::new(CONCURRENT_LOADS)) }
    }

    /// Loads what differs between `current` and `next` (and, with `reload_files`, every policy
    /// read from a file, whose content may have changed) on the runtime; the loop gets the
    /// result as [`Wake::Loaded`] and commits it between two turns.
    fn start(
        &self,
        job: usize,
        generation: u64,
        current: &JobConfig,
        next: JobConfig,
        reload_files: bool,
        wake: mpsc::Sender<Wake>,
    ) {
        let is_file = |plugin: &str| matches!(perennial_policy::parse_source(plugin), Ok(Source::File(_)));
        // A new offer from the operator (its compile for this node is ready) loads again too.
        let changed = |current_ref: &PolicyRef, next_ref: &PolicyRef| {
            serving_ref(current_ref) != serving_ref(next_ref)
                || reload_files && is_file(&next_ref.plugin)
                || offer_changed(current, &next, &next_ref.plugin)
        };
        let shadows = shadow_refs(current) != shadow_refs(&next)
            || reload_files && shadow_refs(&next).iter().flatten().any(|shadow| is_file(&shadow.plugin))
            || shadow_refs(&next).iter().flatten().any(|shadow| offer_changed(current, &next, &shadow.plugin));
        let trigger = changed(&current.trigger, &next.trigger);
        let selector = changed(&current.selector, &next.selector);
        let splitter = match (&current.splitter, &next.splitter) {
            (Some(current), Some(next)) => changed(current, next),
            (current, next) => current != next,
        };
        let fallback_trigger = current.fallback_trigger != next.fallback_trigger
            || next.fallback_trigger.as_ref().is_some_and(|fallback| offer_changed(current, &next, &fallback.plugin));
        // A selector swapped in later falls back as one there from the start does.
        let fallback_selector = wants_fallback_selector(current) != wants_fallback_selector(&next)
            || wants_fallback_selector(&next) && offer_changed(current, &next, SEDNA_SELECTOR);
        let (host, loads) = (self.host.clone(), self.loads.clone());
        self.runtime.spawn(async move {
            let Ok(_permit) = loads.acquire_owned().await else { return };
            let events: Arc<dyn PolicyEvents> = Arc::new(TracingEvents { job: next.name.clone() });
            // The job's status shows each policy loading until the swap commits it or rejects it.
            let saying = |kind: &'static str, plugin: &str| {
                let (wake, plugin) = (wake.clone(), plugin.to_owned());
                move |digest: &str| {
                    let _ = wake.send(Wake::Loading(job, generation, kind, plugin.clone(), digest.to_owned()));
                }
            };
            let mut loaded = LoadedSwap {
                trigger: None,
                selector: None,
                splitter: None,
                fallback_trigger: None,
                fallback_selector: None,
                shadows: None,
                next: next.clone(),
            };
            if shadows {
                loaded.shadows = Some(load_shadows(&host, &next, events.clone()).await);
            }
            if trigger {
                let say = saying("trigger", &next.trigger.plugin);
                let result = load_saying(&host, &next, &next.trigger, events.clone(), &say).await;
                loaded.trigger = Some(result.map_err(|err| err.to_string()));
            }
            if selector {
                let say = saying("selector", &next.selector.plugin);
                let result = load_saying(&host, &next, &next.selector, events.clone(), &say).await;
                loaded.selector = Some(result.map_err(|err| err.to_string()));
            }
            if splitter {
                loaded.splitter = Some(match &next.splitter {
                    Some(reference) => {
                        let say = saying("splitter", &reference.plugin);
                        let result = load_saying(&host, &next, reference, events.clone(), &say).await;
                        result.map(Some).map_err(|err| err.to_string())
                    }
                    None => Ok(None),
                });
            }
            if fallback_trigger {
                loaded.fallback_trigger = Some(match &next.fallback_trigger {
                    Some(reference) if next.trigger.on_error == OnError::Fallback => {
                        load_ref(&host, &next, reference, events.clone()).await.ok()
                    }
                    _ => None,
                });
            }
            if fallback_selector {
                let sedna_selector = PolicyRef::new(SEDNA_SELECTOR);
                loaded.fallback_selector = Some(if wants_fallback_selector(&next) {
                    load_fallback(&host, &next, &sedna_selector, events.clone()).await.ok().flatten()
                } else {
                    None
                });
            }
            let _ = wake.send(Wake::Loaded(job, generation, Box::new(loaded)));
        });
    }
}

/// The policies a swap loaded beside the serving ones; `None` where that kind did not change.
pub struct LoadedSwap {
    next: JobConfig,
    trigger: Option<Result<TriggerPolicy, String>>,
    selector: Option<Result<SelectorPolicy, String>>,
    splitter: Option<Result<Option<SplitterPolicy>, String>>,
    fallback_trigger: Option<Option<TriggerPolicy>>,
    fallback_selector: Option<Option<SelectorPolicy>>,
    shadows: Option<(Shadows, Vec<RefusedShadow>)>,
}

/// A swap's outcome for one kind: the reference, and the digest now serving or why it was rejected.
type SwapOutcome = (&'static str, PolicyRef, Result<String, String>);

/// Commits a loaded swap between two turns: each policy that loaded replaces the serving one
/// (a reload of the same content changes nothing); one that did not is recorded as rejected
/// with its reason, and the previous one serves on.
fn commit(store: &Mutex<Store>, runner: &mut JobRunner, loaded: LoadedSwap) {
    let LoadedSwap { next, trigger, selector, splitter, fallback_trigger, fallback_selector, shadows } = loaded;
    let job = runner.job.name.clone();
    let mut outcomes: Vec<SwapOutcome> = Vec::new();
    if let Some(loaded) = trigger {
        let same = serving_ref(&next.trigger) == serving_ref(&runner.job.trigger);
        let outcome = put(loaded, &mut runner.policies.trigger, same);
        outcomes.extend(outcome.map(|digest| ("trigger", next.trigger.clone(), digest)));
    }
    if let Some(loaded) = selector {
        let same = serving_ref(&next.selector) == serving_ref(&runner.job.selector);
        let outcome = put(loaded, &mut runner.policies.selector, same);
        outcomes.extend(outcome.map(|digest| ("selector", next.selector.clone(), digest)));
    }
    if let Some(loaded) = splitter {
        let reference = next.splitter.clone().unwrap_or_else(|| PolicyRef::new(""));
        let outcome = match (loaded, &mut runner.policies.splitter) {
            (Ok(Some(policy)), Some(serving)) => {
                let same = next.splitter.as_ref().map(serving_ref) == runner.job.splitter.as_ref().map(serving_ref);
                put(Ok(policy), serving, same)
            }
            (Ok(policy), serving) => {
                let digest = policy.as_ref().map_or(String::new(), |p| p.info().digest.clone());
                *serving = policy;
                Some(Ok(digest))
            }
            (Err(why), _) => Some(Err(why)),
        };
        outcomes.extend(outcome.map(|digest| ("splitter", reference, digest)));
    }
    // Each fallback follows the policy that serves: not a new one that was rejected (its
    // `onError` is the new one's, not the serving one's).
    let rejected = |which: &str| outcomes.iter().any(|(kind, _, outcome)| *kind == which && outcome.is_err());
    if let Some(policy) = fallback_trigger.filter(|_| !rejected("trigger")) {
        runner.policies.fallback_trigger = policy;
        runner.job.fallback_trigger = next.fallback_trigger.clone();
    }
    if let Some(policy) = fallback_selector.filter(|_| !rejected("selector")) {
        runner.policies.fallback_selector = policy;
    }
    let mut store = lock(store);
    if let Some((shadows, refused)) = shadows {
        let before: Vec<Option<perennial_types::ShadowRef>> =
            shadow_refs(&runner.job).into_iter().map(|shadow| shadow.cloned()).collect();
        runner.policies.shadows = shadows;
        runner.job.trigger.shadow = next.trigger.shadow.clone();
        runner.job.selector.shadow = next.selector.shadow.clone();
        if let (Some(serving), Some(next)) = (&mut runner.job.splitter, &next.splitter) {
            serving.shadow = next.shadow.clone();
        }
        record_shadows(&mut store, &runner.job, &runner.policies.shadows, &refused);
        for ((kind, before), now) in DecisionKind::ALL.into_iter().zip(before).zip(shadow_refs(&runner.job)) {
            say_shadow_change(&job, kind, before.as_ref(), now, &refused);
        }
    }
    // The operator's offers and the job's registry logins as this swap saw them: one that
    // changes later loads again (and a login rotated or dropped is not held on to).
    runner.job.policy_artifacts = next.policy_artifacts.clone();
    runner.job.registry_auth = next.registry_auth.clone();
    for (kind, reference, outcome) in outcomes {
        let plugin = &reference.plugin;
        let recorded = match &outcome {
            Ok(digest) => {
                let config = perennial_types::config_digest(reference.config.as_ref());
                tracing::info!(job, "the {kind} policy is now {plugin} (sha256 {digest}, config {config})");
                // Its shadow is `next`'s too: loaded above when it differed.
                match kind {
                    "trigger" => runner.job.trigger = next.trigger.clone(),
                    "selector" => runner.job.selector = next.selector.clone(),
                    _ => runner.job.splitter = next.splitter.clone(),
                }
                health::swapped(&mut store, &job, kind, health::Serving { plugin, digest, config: &config }, now())
            }
            Err(why) => {
                tracing::warn!(job, "the new {kind} policy {plugin} was rejected, the previous one serves on: {why}");
                health::rejected(&mut store, &job, kind, &format!("{plugin}: {why}"), now())
            }
        };
        if let Err(err) = recorded {
            tracing::warn!(job, "recording the {kind} policy swap: {err}");
        }
    }
    if let Err(err) = health::loads_ended(&mut store, &job) {
        tracing::warn!(job, "recording the end of the policies' loads: {err}");
    }
    runner.policies.release();
}

/// Says a shadow that started, changed or stopped beside the serving policy of `kind`.
fn say_shadow_change(
    job: &str,
    kind: DecisionKind,
    before: Option<&perennial_types::ShadowRef>,
    now: Option<&perennial_types::ShadowRef>,
    refused: &[RefusedShadow],
) {
    if before == now || refused.iter().any(|(refused, ..)| *refused == kind) {
        return;
    }
    match (before, now) {
        (_, Some(now)) => tracing::info!(job, "the {kind} shadow {} now runs beside the serving policy", now.plugin),
        (Some(before), None) => tracing::info!(job, "the {kind} shadow {} was removed", before.plugin),
        (None, None) => {}
    }
}

/// Puts a loaded policy in place of the serving one; returns its digest, or why it failed, or
/// nothing when it is what already serves (a file reloaded with the same content).
fn put<K: Kind>(
    loaded: Result<Policy<K>, String>,
    slot: &mut Policy<K>,
    same_ref: bool,
) -> Option<Result<String, String>> {
    match loaded {
        Ok(policy) if same_ref && policy.info().digest == slot.info().digest => None,
        Ok(policy) => {
            let digest = policy.info().digest.clone();
            *slot = policy;
            Some(Ok(digest))
        }
        Err(why) => Some(Err(why)),
    }
}

/// Records the job's shadows: loaded, refused with why, or none.
fn record_shadows(store: &mut Store, job: &JobConfig, shadows: &Shadows, refused: &[RefusedShadow]) {
    fn identity<K: perennial_policy::Kind>(policy: &Option<Arc<Policy<K>>>) -> Option<(String, String)> {
        policy.as_ref().map(|p| (p.info().digest.clone(), p.config_digest().to_owned()))
    }
    let loaded = [identity(&shadows.trigger), identity(&shadows.splitter), identity(&shadows.selector)];
    for ((kind, reference), loaded) in DecisionKind::ALL.into_iter().zip(shadow_refs(job)).zip(loaded) {
        let state = match (refused.iter().find(|(k, ..)| *k == kind), reference, &loaded) {
            (Some((_, plugin, why)), ..) => shadow::Loaded::Refused { plugin, why },
            (None, Some(reference), Some((digest, config))) => {
                shadow::Loaded::Serving { plugin: &reference.plugin, digest, config }
            }
            _ => shadow::Loaded::None,
        };
        if let Err(err) = shadow::loaded(store, &job.name, kind, state) {
            tracing::warn!(job = job.name, "recording the {kind} shadow: {err}");
        }
    }
}

/// Records which policies serve a job just loaded (at start, or when it comes to the node), so
/// that its status names them, and not the ones of an earlier run.
pub fn record_serving(store: &mut Store, runner: &JobRunner) {
    let (job, policies) = (&runner.job, &runner.policies);
    record_shadows(store, job, &policies.shadows, &policies.shadows_refused);
    let mut serving = vec![
        ("trigger", &job.trigger, policies.trigger.info().digest.clone()),
        ("selector", &job.selector, policies.selector.info().digest.clone()),
    ];
    match (&job.splitter, &policies.splitter) {
        (Some(reference), Some(splitter)) => serving.push(("splitter", reference, splitter.info().digest.clone())),
        // Sedna's rule, computed natively: no plugin to name.
        _ => {
            if let Err(err) = health::forget(store, &job.name, "splitter") {
                tracing::warn!(job = job.name, "recording the splitter policy: {err}");
            }
        }
    }
    for (kind, reference, digest) in serving {
        let config = perennial_types::config_digest(reference.config.as_ref());
        let serving = health::Serving { plugin: &reference.plugin, digest: &digest, config: &config };
        if let Err(err) = health::swapped(store, &job.name, kind, serving, now()) {
            tracing::warn!(job = job.name, "recording the {kind} policy: {err}");
        }
    }
}

/// What wakes the loop, for a job given by its index in the list given to [`run_jobs`] (jobs
/// added later take the next indexes, in the order they were sent).
pub enum Wake {
    /// Look at the job now: its index file changed, or the control plane moved its stage.
    Job(usize),
    /// Look at the job of that name now: a worker's report moved it on.
    JobNamed(String),
    /// The job was deleted: never run it again.
    Remove(usize),
    /// The job's policy references changed: load them off the loop, then swap them in.
    Swap(usize, Box<JobConfig>),
    /// A swap's policies loaded (for the job's swap of that number): commit it between two turns.
    Loaded(usize, u64, Box<LoadedSwap>),
    /// A swap (of that number) is loading the job's policy of a kind: its plugin and digest (empty
    /// until known), for the job's status.
    Loading(usize, u64, &'static str, String, String),
    /// A job that came to this node (the cloud link's desired state): run it too.
    Add(Box<JobRunner>),
}

/// The loop's wake-up channel.
pub struct Wakes {
    sender: mpsc::Sender<Wake>,
    receiver: mpsc::Receiver<Wake>,
}

impl Wakes {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let (sender, receiver) = mpsc::channel();
        Wakes { sender, receiver }
    }

    pub fn sender(&self) -> mpsc::Sender<Wake> {
        self.sender.clone()
    }
}

/// Logs what [`Faults::note`] says: a repeating error once, then with its count now and then.
fn say(job: &str, said: Say) {
    match said {
        Say::First(message) | Say::Still(message) => tracing::error!(job, "{message}"),
        Say::Ended(message) => tracing::info!(job, "{message}"),
        Say::Nothing => {}
    }
}

/// One turn of a job: ingest one batch, then the edge's step for the job's stage. Returns when
/// to come back, whether a backlog remains, and whether a report was queued.
fn turn(
    store: &Mutex<Store>,
    runner: &mut JobRunner,
    faults: &mut Faults,
    shadows: &ShadowQueue,
) -> (Duration, bool, bool) {
    let JobRunner { job, policies, index, output, copy_model, settings } = runner;
    // Each kind's shadow, if the job has one, asked through the queue.
    let ask = |question: Question| shadows.ask(&policies.shadows, question, now());
    let trigger_shadow: rounds::Shadow<'_> = policies.shadows.trigger.is_some().then_some(&ask);
    let splitter_shadow: rounds::Shadow<'_> = policies.shadows.splitter.is_some().then_some(&ask);
    let selector_shadow: rounds::Shadow<'_> = policies.shadows.selector.is_some().then_some(&ask);
    let mut recheck = settings.poll;
    // A job whose history this edge lacks reads nothing and starts nothing: it says why.
    let held = rounds::held(lock(store).conn(), &job.name);
    if let Ok(Some(why)) = held {
        if let Err(err) = rounds::set_waiting(&mut lock(store), &job.name, Some(&why)) {
            tracing::warn!(job = job.name, "recording why the job waits: {err}");
        }
        if !faults.held_said {
            tracing::error!(job = job.name, "{why}");
            faults.held_said = true;
        }
        return (recheck, false, false);
    }
    let limits = IngestLimits { batches_per_call: 1, ..settings.limits };
    let csv = job.spec.dataset_format.eq_ignore_ascii_case("csv");
    // The store is locked for each read and each commit only: the worker API and the link never
    // wait behind a policy call, a file read or a model copy.
    let split = Split { policy: policies.splitter.as_ref(), train_prob: job.spec.train_prob, shadow: splitter_shadow };
    let mut more = false;
    let mut ingest_fault = None;
    let mut index_missing = None;
    match ingest(store, &job.name, index.as_mut(), csv, &split, limits) {
        Ok(done) => {
            more = done.batches > 0;
            if done.state == FileState::Missing {
                index_missing = Some(format!("the dataset index {} does not exist (yet)", index.name()));
            }
            match (&done.state, faults.missing_said) {
                (FileState::Missing, false) => {
                    tracing::warn!(job = job.name, "waiting for the dataset index {}", index.name());
                    faults.missing_said = true;
                }
                (FileState::Present, _) => faults.missing_said = false,
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
            if policies.splitter.is_some() && done.batches > 0 {
                let failure = done.fell_back.as_ref().map(|err| format!("{err}; Sedna's trainProb rule decided"));
                note(store, &job.name, "splitter", failure.as_deref());
            }
        }
        Err(IngestError::Held(err)) => {
            let held = format!("splitter failed, the job holds (onError: hold): {err}");
            note(store, &job.name, "splitter", Some(&format!("{err}; the job holds (onError: hold)")));
            ingest_fault = Some(held);
        }
        Err(err) => ingest_fault = Some(format!("ingest: {err}")),
    }
    say(&job.name, faults.note(Site::Ingest, ingest_fault.as_deref(), now()));
    let clock = Clock { now: now(), utc_offset_secs: settings.utc_offset_secs };
    let mut index = Index { file: index.as_mut(), csv, url: &job.spec.dataset_url, max_line: settings.limits.max_line };
    let out = OutputDir { url: &job.spec.output_dir, op: output };
    // Read apart: a guard in the match's scrutinee would be held through the whole step.
    let now_in = stage(&lock(store), &job.name);
    let outcome = match now_in {
        Some((Stage::Train, Phase::Waiting)) => {
            let outcome =
                rounds::train_waiting(store, &job.name, &mut index, &out, &policies.trigger, clock, trigger_shadow);
            with_fallback(store, &job.name, "trigger", outcome, policies.fallback_trigger.as_ref(), |trigger| {
                rounds::train_waiting(store, &job.name, &mut index, &out, trigger, clock, trigger_shadow)
            })
        }
        Some((Stage::Eval, Phase::Waiting)) => {
            rounds::eval_waiting(store, &job.name, &mut index, &out, job.spec.eval_set_size(), clock)
        }
        Some((Stage::Deploy, Phase::Waiting)) => {
            let copy_model = copy_model.as_ref();
            let outcome =
                rounds::deploy_waiting(store, &job.name, &out, copy_model, &policies.selector, clock, selector_shadow);
            with_fallback(store, &job.name, "selector", outcome, policies.fallback_selector.as_ref(), |selector| {
                rounds::deploy_waiting(store, &job.name, &out, copy_model, selector, clock, selector_shadow)
            })
        }
        _ => Ok(Outcome::NotDue { reason: "no edge step in this stage".into() }),
    };
    let step_fault = outcome.as_ref().err().map(|err| err.to_string());
    say(&job.name, faults.note(Site::Step, step_fault.as_deref(), now()));
    let why = match &outcome {
        Ok(Outcome::Reported(_)) => Some(None),
        Ok(Outcome::Waiting { reason, .. }) => Some(Some(reason.clone())),
        Err(_) => Some(None),
        Ok(Outcome::NotDue { .. }) => None,
    };
    let fault = faults.summary();
    let mut store = lock(store);
    if let Err(err) = rounds::set_fault(&mut store, &job.name, fault.as_deref()) {
        tracing::warn!(job = job.name, "recording the job's fault: {err}");
    }
    // A fault that repeats is why the job waits, with its count, first; else a missing index.
    let why = match (why, fault.or(index_missing)) {
        (Some(Some(reason)), Some(fault)) => Some(Some(format!("{fault}; {reason}"))),
        (_, Some(fault)) => Some(Some(fault)),
        (why, None) => why,
    };
    if let Some(why) = why
        && let Err(err) = rounds::set_waiting(&mut store, &job.name, why.as_deref())
    {
        tracing::warn!(job = job.name, "recording why the job waits: {err}");
    }
    drop(store);
    let mut reported = false;
    match outcome {
        Ok(Outcome::Reported(report)) => {
            tracing::info!(job = job.name, round = report.round, "{} {}", report.phase, report.status);
            reported = true;
        }
        Ok(Outcome::Waiting { recheck_after_secs: Some(secs), .. }) => {
            // At least a second: a trigger that asks for 0 must not spin the loop.
            recheck = recheck.min(Duration::from_secs(secs.max(1)));
        }
        Ok(Outcome::Waiting { .. } | Outcome::NotDue { .. }) | Err(_) => {}
    }
    (recheck, more, reported)
}

/// Notes a policy's health; a failure to note it is only logged.
fn note(store: &Mutex<Store>, job: &str, kind: &str, failure: Option<&str>) {
    if let Err(err) = health::record(&mut lock(store), job, kind, failure, now()) {
        tracing::warn!(job, "recording the {kind} policy's health: {err}");
    }
}

/// Notes how the job's `kind` policy did; when it failed and a built-in rule stands in for it
/// (`onError: fallback`), the step is done again with that rule (nothing was written before the
/// policy's answer). Without one, the job holds, and says why.
fn with_fallback<P>(
    store: &Mutex<Store>,
    job: &str,
    kind: &'static str,
    outcome: Result<Outcome, RoundError>,
    fallback: Option<&P>,
    again: impl FnOnce(&P) -> Result<Outcome, RoundError>,
) -> Result<Outcome, RoundError> {
    match outcome {
        Err(RoundError::Policy { kind: failed, error }) if failed == kind => match fallback {
            Some(rule) => {
                note(store, job, kind, Some(&format!("{error}; Sedna's rule decided")));
                tracing::warn!(job, "the {kind} policy failed, Sedna's rule decides: {error}");
                again(rule)
            }
            None => {
                note(store, job, kind, Some(&format!("{error}; the job holds")));
                Err(RoundError::Policy { kind: failed, error })
            }
        },
        Ok(outcome) => {
            if !matches!(outcome, Outcome::NotDue { .. }) {
                note(store, job, kind, None);
            }
            Ok(outcome)
        }
        other => other,
    }
}

/// Where the control plane last said the job is.
fn stage(store: &Store, job: &str) -> Option<(Stage, Phase)> {
    let (stage, phase): (String, String) = store
        .conn()
        .prepare_cached("SELECT stage, phase FROM jobs WHERE name = ?1")
        .and_then(|mut read| read.query_row([job], |r| Ok((r.get(0)?, r.get(1)?))))
        .ok()?;
    Some((Stage::parse(&stage)?, Phase::parse(&phase)?))
}

/// The change watcher of the local indexes: one for the folders of all of them, made when the
/// first local index comes (a node with none has no watcher), following the jobs that come and
/// go (the link's desired state). An event on an index wakes its job.
struct IndexWatch {
    wake: mpsc::Sender<Wake>,
    watcher: Option<notify::RecommendedWatcher>,
    /// The watched jobs' indexes, by the job's place in the loop (shared with the watcher).
    indexes: Arc<Mutex<Vec<(usize, PathBuf)>>>,
    /// How many watched indexes each watched folder holds.
    folders: HashMap<PathBuf, usize>,
    /// Folders that could not be watched (not there yet): tried again, their jobs polled meanwhile.
    unwatched: HashSet<PathBuf>,
    /// When the unwatched folders were last tried.
    tried: Instant,
}

/// How often folders that could not be watched are tried again.
const WATCH_RETRY: Duration = Duration::from_secs(2);

impl IndexWatch {
    fn new(wake: mpsc::Sender<Wake>) -> Self {
        let (folders, unwatched) = (HashMap::new(), HashSet::new());
        IndexWatch { wake, watcher: None, indexes: Arc::default(), folders, unwatched, tried: Instant::now() }
    }

    /// Tries the folders that could not be watched again (at most every [`WATCH_RETRY`]); a
    /// folder watched now wakes its jobs, as its index may have appeared meanwhile.
    fn retry(&mut self) {
        if self.unwatched.is_empty() || self.tried.elapsed() < WATCH_RETRY {
            return;
        }
        self.tried = Instant::now();
        let Some(watcher) = &mut self.watcher else { return };
        let now_watched: Vec<PathBuf> = self
            .unwatched
            .iter()
            .filter(|folder| watcher.watch(folder, RecursiveMode::NonRecursive).is_ok())
            .cloned()
            .collect();
        for folder in now_watched {
            tracing::info!("watching {} now", folder.display());
            self.unwatched.remove(&folder);
            for (job, index) in self.indexes.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                if folder_of(index) == folder {
                    let _ = self.wake.send(Wake::Job(*job));
                }
            }
        }
    }

    /// Watches job `job`'s index from now on, if it is a local file (S3 is polled).
    fn add(&mut self, job: usize, index: &dyn IndexFile) {
        let Some(path) = index.local_path() else { return };
        self.indexes.lock().unwrap_or_else(|p| p.into_inner()).push((job, path.to_owned()));
        let folder = folder_of(path);
        let count = self.folders.entry(folder.clone()).or_insert(0);
        *count += 1;
        if *count > 1 {
            return;
        }
        if self.watcher.is_none() {
            self.watcher = self.make_watcher();
        }
        if let Some(watcher) = &mut self.watcher
            && let Err(err) = watcher.watch(&folder, RecursiveMode::NonRecursive)
        {
            // The stat fallback still sees the file grow, until the folder can be watched.
            tracing::warn!("cannot watch {}: {err}; polling it until it can be", folder.display());
            self.unwatched.insert(folder);
        }
    }

    /// Stops watching job `job`'s index, and its folder when no other index is in it.
    fn remove(&mut self, job: usize) {
        let gone: Vec<PathBuf> = {
            let mut indexes = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
            let (gone, kept) = std::mem::take(&mut *indexes).into_iter().partition(|(i, _)| *i == job);
            *indexes = kept;
            gone.into_iter().map(|(_, path)| path).collect()
        };
        for path in gone {
            let folder = folder_of(&path);
            let Some(count) = self.folders.get_mut(&folder) else { continue };
            *count -= 1;
            if *count == 0 {
                self.folders.remove(&folder);
                self.unwatched.remove(&folder);
                if let Some(watcher) = &mut self.watcher {
                    let _ = watcher.unwatch(&folder);
                }
            }
        }
    }

    fn make_watcher(&self) -> Option<notify::RecommendedWatcher> {
        let (indexes, wake) = (self.indexes.clone(), self.wake.clone());
        let made = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // An open or a read is no change, and our own reads would wake the job again.
            let Ok(event) = event.map_err(drop).and_then(|e| if e.kind.is_access() { Err(()) } else { Ok(e) }) else {
                return;
            };
            for (job, index) in indexes.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                if event.paths.iter().any(|path| {
                    path == index || path.file_name() == index.file_name() && path.parent() == index.parent()
                }) {
                    let _ = wake.send(Wake::Job(*job));
                }
            }
        });
        match made {
            Ok(watcher) => Some(watcher),
            Err(err) => {
                tracing::warn!("no change notification ({err}): the indexes are polled");
                None
            }
        }
    }
}

fn folder_of(index: &Path) -> PathBuf {
    index.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dataset's folder that does not exist when its job comes is watched once it does: the
    /// job is woken by the index's changes again, not polled for the life of the process.
    #[test]
    fn a_folder_made_after_its_job_came_is_watched_once_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("later");
        let (wake, woken) = mpsc::channel();
        let mut watch = IndexWatch::new(wake);
        watch.add(0, &crate::LocalFile::new(folder.join("index.csv")));
        assert!(watch.unwatched.contains(&folder));
        std::fs::create_dir(&folder).unwrap();
        watch.tried = Instant::now() - WATCH_RETRY;
        watch.retry();
        assert!(watch.unwatched.is_empty());
        assert!(matches!(woken.recv_timeout(Duration::from_secs(1)), Ok(Wake::Job(0))), "woken when watched");
        std::fs::write(folder.join("index.csv"), "a,b\n1,2\n").unwrap();
        assert!(matches!(woken.recv_timeout(Duration::from_secs(5)), Ok(Wake::Job(0))), "woken by a change");
    }

    #[test]
    fn a_new_login_for_an_oci_policys_registry_loads_it_again() {
        use perennial_types::{Password, RegistryLogin};
        let oci = "oci://127.0.0.1:5000/team/trigger:v1";
        let job: JobConfig = serde_json::from_value(serde_json::json!({
            "name": "ml/j", "uid": "u", "trigger": {"plugin": oci},
            "spec": {"datasetUrl": "/d/index.txt", "datasetFormat": "txt", "outputDir": "/o", "trainProb": 0.8}
        }))
        .unwrap();
        let mut next = job.clone();
        let login = RegistryLogin { secret: "ml/regcred".into(), username: "ann".into(), password: Password::new("p") };
        next.registry_auth.logins.insert("127.0.0.1:5000".into(), login);
        assert!(offer_changed(&job, &next, oci), "a login came");
        assert!(!offer_changed(&next, &next.clone(), oci));
        assert!(!offer_changed(&job, &next, "builtin:first-select"), "not a registry's policy");
        let mut elsewhere = job.clone();
        elsewhere.registry_auth.logins = next.registry_auth.logins.clone();
        elsewhere.registry_auth.logins.insert("ghcr.io".into(), next.registry_auth.logins["127.0.0.1:5000"].clone());
        assert!(!offer_changed(&next, &elsewhere, oci), "another registry's login changed only");
    }
}
