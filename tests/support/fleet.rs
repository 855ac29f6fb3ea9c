//! A fleet of simulated edge nodes on one operator (issue #36), shared by the fleet bench
//! (`runtime/cli/benches/fleet.rs`) and the cluster suite's fleet test.
//!
//! Each node is the edge's own link client ([`perennial_link::edge_client::run`]: real TLS,
//! WebSocket, its own bearer token from the operator's node tokens Secret, heartbeats, acks,
//! resends after a cut) over a small in-memory stand-in for the edge's SQLite state: the desired
//! jobs and datasets it holds, and an outbox of reports. No Wasm runtime, no SQLite: what is
//! measured is the operator (a real `perennial operator` process, as its ServiceAccount, on a
//! real API server), not a simulation of it. One Dataset and one job per node, placed on it.
//!
//! The stand-in sends what the real agent sends at each stage (`runtime/edge`): its dataset's
//! sample count and Train Ready with the round's input URLs when the job waits in Train, Eval
//! Ready with the train result's models when it waits in Eval, Deploy Ready with the model it
//! deployed when it waits in Deploy, the workers' results as the agent relays them, and the
//! job's policies (`status.policies`) whenever the trigger it holds changes. The fleet plays the
//! kubelet (pods marked Running, then Succeeded, at once).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use perennial_api::{Dataset, LifelongLearningJob};
use perennial_link::edge_client::{self, ClientSettings, EdgeState, LinkEvents, TokenSource};
use perennial_link::{Changes, Delete};
use perennial_types::{Input, Model, Output, Phase, Report, Stage, node_job};
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore, watch};

use crate::measure;
use crate::sedna_worker;

/// Samples a node adds to its dataset a round (the trigger's threshold is below it).
const SAMPLES: u64 = 50;
const THRESHOLD: u32 = 40;
/// The threshold a policy change sets on every job.
const CHANGED_THRESHOLD: u32 = 41;
/// The label of a fleet's Node objects: its namespace.
const FLEET_LABEL: &str = "perennial.io/fleet";
/// Calls to the API server the fleet makes at once (creating objects, patching them).
const API_CONCURRENCY: usize = 32;

/// Child processes the fleet started (the operator), for a watchdog that exits without unwinding.
pub static STARTED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Kills what [`STARTED`] holds.
pub fn kill_started() {
    for pid in STARTED.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
        // SAFETY: kill(2) on a pid this process started; at worst it has exited already.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
}

/// Raises this process's open-file limit to its hard limit (children, the operator among them,
/// inherit it): a node is a socket here and one in the operator. Returns (soft, hard).
pub fn raise_fd_limit() -> (u64, u64) {
    perennial_link::open_files::raise_to_hard_limit()
}

/// [`raise_fd_limit`], the hard limit first raised to `needed` where this process may (root, or
/// CAP_SYS_RESOURCE: up to the kernel's `fs.nr_open`); where it may not, the hard limit stays.
// rlim_t is 32 bits wide on some targets.
#[allow(clippy::unnecessary_cast)]
pub fn raise_fd_limit_to(needed: u64) -> (u64, u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a properly initialised rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && (limit.rlim_max as u64) < needed {
            let raised = libc::rlimit { rlim_cur: limit.rlim_cur, rlim_max: needed as libc::rlim_t };
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &raised);
        }
    }
    raise_fd_limit()
}

/// Where the fleet runs.
pub struct Setup {
    /// An admin client of the API server.
    pub client: kube::Client,
    pub server: String,
    pub ca_pem: Vec<u8>,
    /// The `perennial` binary the operator runs.
    pub binary: PathBuf,
    /// A fresh namespace for the fleet's objects (the CRDs and `deploy/operator` installed).
    pub namespace: String,
    /// A folder for the operator's files and logs.
    pub dir: PathBuf,
    pub nodes: usize,
    /// The `up` state directory (kube-apiserver.pid, etcd.pid), for their CPU.
    pub k8s_state: Option<PathBuf>,
    /// The nodes reach the operator through a Service that follows the leading replica; else
    /// straight at the operator's link (and a failover's standby takes the leader's link port).
    /// The Service proxies in this process: three sockets a node instead of one, so that an
    /// open-file limit of 20,000 holds about 6,600 nodes through it.
    pub through_service: bool,
}

/// One phase's figures, printed on one line.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub phase: String,
    pub nodes: usize,
    pub connected: usize,
    pub seconds: f64,
    pub rss_mib: f64,
    /// The operator's CPU seconds per minute of the phase.
    pub cpu_per_min: Option<f64>,
    /// Link bytes per node per second (TLS records on the wire, the operator's sockets):
    /// edge -> operator, operator -> edge, in kbit/s.
    pub kbit_up: Option<f64>,
    pub kbit_down: Option<f64>,
    pub job_rounds: Option<usize>,
    pub requests_per_job_round: Option<f64>,
    /// The operator's own requests per job-round (its /metrics).
    pub operator_requests_per_job_round: Option<f64>,
    pub apiserver_cpu_per_job_round: Option<f64>,
    pub etcd_cpu_per_job_round: Option<f64>,
    /// Anything else worth a figure: (name, value).
    pub extra: Vec<(String, String)>,
    pub load: String,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fleet {:<8} nodes={} connected={} time_s={:.1} operator_rss_mib={:.1}",
            self.phase, self.nodes, self.connected, self.seconds, self.rss_mib
        )?;
        if let Some(cpu) = self.cpu_per_min {
            write!(f, " operator_cpu_s_per_min={cpu:.2}")?;
        }
        if let (Some(up), Some(down)) = (self.kbit_up, self.kbit_down) {
            write!(f, " link_kbit_s_per_node_up={up:.4} down={down:.4}")?;
        }
        if let Some(rounds) = self.job_rounds {
            write!(f, " job_rounds={rounds}")?;
        }
        if let Some(requests) = self.requests_per_job_round {
            write!(f, " api_requests_per_job_round={requests:.1}")?;
        }
        if let Some(requests) = self.operator_requests_per_job_round {
            write!(f, " operator_requests_per_job_round={requests:.1}")?;
        }
        if let Some(cpu) = self.apiserver_cpu_per_job_round {
            write!(f, " apiserver_cpu_s_per_job_round={cpu:.4}")?;
        }
        if let Some(cpu) = self.etcd_cpu_per_job_round {
            write!(f, " etcd_cpu_s_per_job_round={cpu:.4}")?;
        }
        for (name, value) in &self.extra {
            write!(f, " {name}={value}")?;
        }
        write!(f, " load=\"{}\"", self.load)
    }
}

// ---------------------------------------------------------------- the node's in-memory state

/// What every node adds up to.
#[derive(Default)]
pub struct Totals {
    pub connected: AtomicUsize,
    pub connects: AtomicU64,
    pub queued: AtomicU64,
    pub acked: AtomicU64,
    pub rejected: Mutex<Vec<String>>,
}

/// A job as its node holds it.
#[derive(Default)]
struct HeldJob {
    uid: String,
    output_dir: String,
    dataset: String,
    /// `round/Stage` steps already reported (a desired state sent again is not acted on twice).
    acted: BTreeSet<String>,
    /// The trigger's config, as JSON text (a policy change shows here).
    trigger: Option<String>,
    /// The last train result's models, for the Eval Ready report.
    train_models: Vec<Model>,
    /// The last notice: (stage, round).
    notice: Option<(Stage, u64)>,
}

/// The stand-in for one edge's SQLite store.
struct NodeState {
    allocated: u64,
    outbox: BTreeMap<u64, Value>,
    desired_seq: u64,
    jobs: BTreeMap<String, HeldJob>,
    datasets: BTreeSet<String>,
    /// Rounds this node plays (the rounds phase raises it for its share of the nodes).
    rounds_wanted: u64,
    /// Samples counted in its dataset so far (what its count reports said last).
    samples: u64,
    /// When the node first held its job and dataset.
    synced_at: Option<Instant>,
    /// When the node held a changed trigger.
    policy_at: Option<Instant>,
    /// A reconnect started then (churn): the time to the next desired state applied is kept.
    reconnecting: Option<Instant>,
    resynced: Vec<Duration>,
    /// A notice of Train for round `rounds_wanted` arrived (its rounds are done).
    rounds_done_at: Option<Instant>,
    totals: Arc<Totals>,
}

impl NodeState {
    fn queue(&mut self, body: Value) {
        self.allocated += 1;
        self.outbox.insert(self.allocated, body);
        self.totals.queued.fetch_add(1, Ordering::Relaxed);
    }

    fn queue_report(&mut self, report: &Report) {
        self.queue(serde_json::to_value(report).expect("a report is JSON"));
    }

    /// The reports the real agent sends for what the job's notice says.
    fn act(&mut self, key: &str) {
        let wanted = self.rounds_wanted;
        let Some(job) = self.jobs.get(key) else { return };
        let Some((stage, round)) = job.notice else { return };
        let (uid, output, dataset) = (job.uid.clone(), job.output_dir.clone(), job.dataset.clone());
        let report = |round: u64, phase: Stage, status: Phase, input: Option<Input>, reason: Option<String>| Report {
            job: key.to_owned(),
            job_uid: uid.clone(),
            round: round as i64,
            phase,
            status,
            input,
            output: None,
            reason,
            next_follows: false,
        };
        let url = |path: String| format!("{}/{path}", output.trim_end_matches('/'));
        let step = match stage {
            Stage::Train => round + 1,
            _ => round,
        };
        if stage == Stage::Train && round >= wanted {
            if round > 0 && self.rounds_done_at.is_none() && round == wanted {
                self.rounds_done_at = Some(Instant::now());
            }
            return;
        }
        let mark = format!("{step}/{stage}");
        if !self.jobs.get_mut(key).is_some_and(|job| job.acted.insert(mark)) {
            return;
        }
        match stage {
            Stage::Train => {
                self.samples += SAMPLES;
                let samples = self.samples;
                self.queue(json!({"dataset": dataset, "numberOfSamples": samples}));
                let input = Input {
                    models: Vec::new(),
                    data_url: Some(url(format!("data/train/{step}/data.txt"))),
                    data_index_url: None,
                    output_dir: Some(url(format!("train/{step}"))),
                };
                let reason = format!("num_of_samples {samples} >= {THRESHOLD}");
                self.queue_report(&report(step, Stage::Train, Phase::Ready, Some(input), Some(reason)));
            }
            Stage::Eval => {
                let models = self.jobs.get(key).map(|job| job.train_models.clone()).unwrap_or_default();
                let input = Input {
                    models,
                    data_url: Some(url(format!("data/eval/{step}/data.txt"))),
                    data_index_url: None,
                    output_dir: Some(url(format!("eval/{step}"))),
                };
                self.queue_report(&report(step, Stage::Eval, Phase::Ready, Some(input), None));
            }
            Stage::Deploy => {
                let deployed = Model {
                    format: "pkl".into(),
                    url: url("deploy/index.pkl".into()),
                    metrics: Some(json!({"precision_score": 0.9})),
                };
                let input = Input { models: vec![deployed], ..Input::default() };
                let reason = Some("the first candidate".to_owned());
                self.queue_report(&report(step, Stage::Deploy, Phase::Ready, Some(input), reason));
            }
        }
    }

    /// The job's policies as the agent reports them after loading them.
    fn policies_report(&mut self, key: &str) {
        let Some(job) = self.jobs.get(key) else { return };
        let config = job.trigger.as_deref().unwrap_or_default();
        let digest = {
            use sha2::Digest as _;
            hex::encode(sha2::Sha256::digest(config.as_bytes()))
        };
        let body = json!({"job": key, "jobUid": job.uid, "fault": null, "policies": {"trigger": {
            "plugin": "builtin:threshold-trigger", "digest": "fleet", "config": &digest[..12], "health": "Serving"}}});
        self.queue(body);
    }
}

impl EdgeState for NodeState {
    fn allocated(&mut self) -> Result<u64, String> {
        Ok(self.allocated)
    }

    fn fetch(&mut self, after: u64, limit: usize) -> Result<Vec<(u64, Value)>, String> {
        Ok(self.outbox.range(after + 1..).take(limit).map(|(seq, body)| (*seq, body.clone())).collect())
    }

    fn delete(&mut self, delete: Delete) -> Result<(), String> {
        let gone: Vec<u64> = match delete {
            Delete::Through(seq) => self.outbox.range(..=seq).map(|(s, _)| *s).collect(),
            Delete::Only(seq) => vec![seq],
        };
        for seq in gone {
            if self.outbox.remove(&seq).is_some() && matches!(delete, Delete::Through(_)) {
                self.totals.acked.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn renumber_above(&mut self, floor: u64) -> Result<(), String> {
        let rows = std::mem::take(&mut self.outbox);
        self.outbox = rows.into_iter().map(|(seq, body)| (seq + floor, body)).collect();
        self.allocated = self.outbox.keys().next_back().copied().unwrap_or(0).max(floor);
        Ok(())
    }

    fn last_applied_desired(&mut self) -> Result<u64, String> {
        Ok(self.desired_seq)
    }

    fn held(&mut self) -> Result<(BTreeSet<String>, BTreeSet<String>), String> {
        Ok((self.jobs.keys().cloned().collect(), self.datasets.clone()))
    }

    fn apply_desired(&mut self, changes: &Changes) -> Result<(), String> {
        for (key, _) in &changes.datasets {
            self.datasets.insert(key.clone());
        }
        for (key, object) in &changes.jobs {
            let job = node_job(key, object)?;
            let held = self.jobs.entry(key.clone()).or_default();
            held.uid = job.metadata.uid.clone();
            held.output_dir = job.config.spec.output_dir.clone();
            held.dataset = job.config.spec.dataset.clone();
            held.notice = job.notice.as_ref().map(|notice| (notice.stage, notice.round));
            let trigger = serde_json::to_string(&job.config.trigger.config).ok();
            let changed = held.trigger.is_some() && held.trigger != trigger;
            let first = held.trigger.is_none();
            held.trigger = trigger;
            if changed && self.policy_at.is_none() {
                self.policy_at = Some(Instant::now());
            }
            if changed || first {
                self.policies_report(key);
            }
            self.act(key);
        }
        for key in &changes.removed_jobs {
            self.jobs.remove(key);
        }
        for key in &changes.removed_datasets {
            self.datasets.remove(key);
        }
        self.desired_seq = changes.seq;
        if self.synced_at.is_none() && !self.jobs.is_empty() && !self.datasets.is_empty() {
            self.synced_at = Some(Instant::now());
        }
        if let Some(since) = self.reconnecting.take() {
            self.resynced.push(since.elapsed());
        }
        Ok(())
    }
}

fn lock(state: &Mutex<NodeState>) -> std::sync::MutexGuard<'_, NodeState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

struct Events {
    up: AtomicBool,
    ever: AtomicBool,
    totals: Arc<Totals>,
}

impl LinkEvents for Events {
    fn desired_applied(&self, _changes: &Changes) {}

    fn connected(&self, up: bool) {
        if up {
            self.ever.store(true, Ordering::Relaxed);
            self.totals.connects.fetch_add(1, Ordering::Relaxed);
        }
        if self.up.swap(up, Ordering::Relaxed) != up {
            if up {
                self.totals.connected.fetch_add(1, Ordering::Relaxed);
            } else {
                self.totals.connected.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    fn rejected(&self, seq: u64, reason: &str) {
        self.totals.rejected.lock().unwrap_or_else(|p| p.into_inner()).push(format!("report {seq}: {reason}"));
    }
}

/// One simulated node: the edge's link client over its in-memory state.
pub struct SimNode {
    pub name: String,
    job: String,
    state: Arc<Mutex<NodeState>>,
    outbox: Arc<Notify>,
    events: Arc<Events>,
    settings: ClientSettings,
    running: Mutex<Option<(watch::Sender<bool>, tokio::task::JoinHandle<()>)>>,
}

impl SimNode {
    fn start(&self) {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(edge_client::run(
            self.settings.clone(),
            self.state.clone(),
            self.outbox.clone(),
            self.events.clone(),
            stopped,
        ));
        *self.running.lock().unwrap_or_else(|p| p.into_inner()) = Some((stop, task));
    }

    /// Closes the link (as a node that goes away) and opens it again.
    async fn reconnect(&self, away: Duration) {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((stop, task)) = running {
            let _ = stop.send(true);
            let _ = task.await;
        }
        tokio::time::sleep(away).await;
        lock(&self.state).reconnecting = Some(Instant::now());
        self.start();
    }

    fn stop(&self) {
        if let Some((stop, _)) = self.running.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = stop.send(true);
        }
    }

    /// A worker's result, relayed as the agent's worker API does.
    fn worker_report(&self, pod: &Pod, namespace: &str, kind: &str, round: i64) {
        let body = sedna_worker::report(pod, namespace, kind);
        let models: Vec<Model> = serde_json::from_value(body["results"].clone()).unwrap_or_default();
        let mut state = lock(&self.state);
        let Some(job) = state.jobs.get_mut(&self.job) else { return };
        let train = kind == "train";
        if train {
            job.train_models = models.clone();
        }
        // As the agent: on to the eval step at once from its own Train step of this round with a
        // model, not from a round the operator failed meanwhile (its notice came back to Train).
        let follows = train
            && !models.is_empty()
            && job.acted.contains(&format!("{round}/Train"))
            && !job.acted.contains(&format!("{round}/Eval"))
            && job.notice != Some((Stage::Train, round as u64));
        let report = Report {
            job: self.job.clone(),
            job_uid: job.uid.clone(),
            round,
            phase: if train { Stage::Train } else { Stage::Eval },
            status: Phase::Completed,
            input: None,
            output: Some(Output { models }),
            reason: None,
            next_follows: follows,
        };
        state.queue_report(&report);
        if follows {
            if let Some(job) = state.jobs.get_mut(&self.job) {
                job.notice = Some((Stage::Eval, round as u64));
            }
            let key = self.job.clone();
            state.act(&key);
        }
        drop(state);
        self.outbox.notify_one();
    }
}

/// Each node of `playing` plays one more round of its job (from where its job is): its reports
/// queued. Returns each node's job and the round it now plays.
fn start_rounds(playing: &[Arc<SimNode>]) -> Vec<(String, u64)> {
    let mut wanted = Vec::with_capacity(playing.len());
    for node in playing {
        let mut state = lock(&node.state);
        state.rounds_wanted += 1;
        state.rounds_done_at = None;
        wanted.push((node.job.clone(), state.rounds_wanted));
        let keys: Vec<String> = state.jobs.keys().cloned().collect();
        for key in keys {
            state.act(&key);
        }
        drop(state);
        node.outbox.notify_one();
    }
    wanted
}

// ---------------------------------------------------------------- the operator

/// `perennial operator`, its log in a file; killed when dropped.
pub struct Operator {
    child: Child,
    pub log: PathBuf,
    pub metrics_port: u16,
    pub link_port: u16,
    pub started: Instant,
}

impl Operator {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn rss_mib(&self) -> f64 {
        measure::rss_mib(self.pid())
    }

    pub fn cpu_seconds(&self) -> f64 {
        measure::cpu_seconds(self.pid()).unwrap_or(f64::NAN)
    }

    /// Why the operator is no longer running, if it is not.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!("the operator exited ({status})\n{}", self.tail())),
            Ok(None) => None,
            Err(err) => Some(format!("the operator's status: {err}")),
        }
    }

    /// The log's errors and warnings (the last 20), and its last 20 lines.
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let said: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.contains("ERROR") || l.contains("WARN") || l.contains("panicked") || l.starts_with("Error"))
            .collect();
        format!(
            "----- {} (errors and warnings) -----\n{}\n----- its end -----\n{}",
            self.log.display(),
            said[said.len().saturating_sub(20)..].join("\n"),
            lines[lines.len().saturating_sub(20)..].join("\n")
        )
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free port below the kernel's ephemeral range (32768 and up by default), for the link the
/// nodes dial before the operator listens on it: a port in that range could be taken by a
/// retrying node's connection to itself (a TCP self-connect), and the operator could not bind it.
fn free_port_below_ephemeral() -> u16 {
    let start = 20_000 + (std::process::id() % 12_000) as u16;
    (start..32_000)
        .chain(20_000..start)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port under 32000")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// The link's bytes on the operator's side of every established connection to `port`:
/// (received from the nodes, sent to them, connections), from the kernel's TCP info (`ss`).
pub fn link_bytes(port: u16) -> (u64, u64, usize) {
    let filter = format!("sport = :{port}");
    let output = Command::new("ss").args(["-Htin", "state", "established", &filter]).output();
    let Ok(output) = output else { return (0, 0, 0) };
    let text = String::from_utf8_lossy(&output.stdout);
    let (mut received, mut sent, mut connections) = (0, 0, 0);
    for word in text.split_whitespace() {
        if let Some(n) = word.strip_prefix("bytes_received:") {
            received += n.parse::<u64>().unwrap_or(0);
        } else if let Some(n) = word.strip_prefix("bytes_sent:") {
            sent += n.parse::<u64>().unwrap_or(0);
            connections += 1;
        }
    }
    (received, sent, connections)
}

/// `perennial operator` for the fleet's namespace as `identity` (its own link and metrics ports),
/// as the operator's ServiceAccount; its log in the fleet's folder.
fn spawn_operator(setup: &Setup, kubeconfig: &Path, identity: &str, link_port: u16) -> Operator {
    let metrics_port = free_port();
    let path = |name: &str| setup.dir.join(name).display().to_string();
    let namespace = &setup.namespace;
    let args: Vec<String> = [
        "operator",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--namespace",
        namespace,
        "--metrics-addr",
        &format!("127.0.0.1:{metrics_port}"),
        "--lease-namespace",
        "perennial-system",
        "--lease-name",
        &format!("operator-{namespace}"),
        "--identity",
        identity,
        "--link-addr",
        &format!("127.0.0.1:{link_port}"),
        "--link-cert",
        &path("link.crt"),
        "--link-key",
        &path("link.key"),
        "--link-tokens",
        &format!("{namespace}/fleet-tokens"),
    ]
    .map(str::to_owned)
    .to_vec();
    let log = setup.dir.join(format!("operator-{identity}.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let child = Command::new(&setup.binary)
        .args(&args)
        .env("RUST_LOG", "info")
        .env_remove("KUBECONFIG")
        .stdout(Stdio::from(file.try_clone().expect("log")))
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap_or_else(|err| panic!("starting {}: {err}", setup.binary.display()));
    STARTED.lock().unwrap_or_else(|p| p.into_inner()).push(child.id());
    Operator { child, log, metrics_port, link_port, started: Instant::now() }
}

/// Whether the operator on `metrics_port` leads (its `/leaderz`).
async fn leads(http: &reqwest::Client, metrics_port: u16) -> bool {
    let url = format!("http://127.0.0.1:{metrics_port}/leaderz");
    matches!(http.get(url).timeout(Duration::from_secs(1)).send().await, Ok(r) if r.status().is_success())
}

/// The Service in front of the replicas: each new connection goes to the leading replica's link
/// (as the Service's selector of the leader's pod label does); while none leads, connections are
/// closed at once. Which one leads is asked every 100 ms, not per connection.
struct Service {
    port: u16,
    /// The replicas: (metrics port, link port).
    replicas: Arc<Mutex<Vec<(u16, u16)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Service {
    async fn start() -> Service {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the service");
        let port = listener.local_addr().expect("address").port();
        let replicas: Arc<Mutex<Vec<(u16, u16)>>> = Arc::default();
        let leader = Arc::new(std::sync::atomic::AtomicU16::new(0));
        let asking = {
            let (replicas, leader) = (replicas.clone(), leader.clone());
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                loop {
                    let known = replicas.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let mut leading = 0;
                    for (metrics_port, link_port) in known {
                        if leads(&http, metrics_port).await {
                            leading = link_port;
                            break;
                        }
                    }
                    leader.store(leading, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        let serving = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { continue };
                let link_port = leader.load(Ordering::Relaxed);
                if link_port == 0 {
                    continue; // dropped: no replica leads
                }
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", link_port)).await {
                        let _ = outbound.set_nodelay(true);
                        let _ = inbound.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Service { port, replicas, tasks: vec![asking, serving] }
    }

    fn add(&self, operator: &Operator) {
        self.replicas.lock().unwrap_or_else(|p| p.into_inner()).push((operator.metrics_port, operator.link_port));
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

// ---------------------------------------------------------------- the fleet

/// Pods seen per (job, round, worker type), for the check that no step was done twice.
type PodsSeen = Mutex<HashMap<(String, String, String), BTreeSet<String>>>;

pub struct Fleet {
    pub setup: Setup,
    pub operator: Operator,
    /// The operator's kubeconfig (its ServiceAccount's), for a standby started later.
    operator_kubeconfig: PathBuf,
    /// The nodes' way in: the leading replica's link, as a Service would choose it.
    service: Service,
    pub nodes: Vec<Arc<SimNode>>,
    pub totals: Arc<Totals>,
    /// The kubelet runs pods (else it leaves them Pending).
    run_pods: Arc<AtomicBool>,
    /// The kubelet's own API calls.
    own_calls: Arc<AtomicU64>,
    pods_seen: Arc<PodsSeen>,
    /// How many nodes (the first ones) a rounds phase has played.
    played: usize,
    kubelet: tokio::task::JoinHandle<()>,
    http: reqwest::Client,
    pub figures: Vec<Figures>,
}

impl Fleet {
    /// The node tokens' Secret, the operator's RoleBinding, one Dataset and one job per node; the
    /// nodes started (their link retrying); then the operator. Figures: the objects' creation,
    /// and the time from the operator's start to every node connected and holding its job.
    pub async fn start(setup: Setup) -> Fleet {
        let (namespace, n) = (setup.namespace.clone(), setup.nodes);
        let client = setup.client.clone();
        let totals = Arc::new(Totals::default());
        // Node names are cluster-wide: each fleet's its own.
        let names: Vec<String> = (0..n).map(|i| format!("{namespace}-n{i}")).collect();
        let tokens: Vec<String> = names
            .iter()
            .map(|_| {
                let mut bytes = [0u8; 16];
                getrandom::fill(&mut bytes).expect("random");
                hex::encode(bytes)
            })
            .collect();
        let data: serde_json::Map<String, Value> =
            names.iter().zip(&tokens).map(|(node, token)| (node.clone(), json!(token))).collect();
        let secret_bytes: usize = names.iter().zip(&tokens).map(|(a, b)| a.len() + b.len()).sum();
        let secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": "fleet-tokens"}, "stringData": data})).expect("secret");
        Api::<Secret>::namespaced(client.clone(), &namespace)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap_or_else(|err| panic!("the node tokens' Secret ({n} nodes, {secret_bytes} bytes): {err}"));
        // The cluster-wide install reads Secrets only where this is bound (README).
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "perennial-operator-credentials"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "perennial-operator-credentials"},
            "subjects": [{"kind": "ServiceAccount", "name": "perennial-operator", "namespace": "perennial-system"}]
        }))
        .expect("binding");
        Api::<RoleBinding>::namespaced(client.clone(), &namespace)
            .create(&PostParams::default(), &binding)
            .await
            .expect("the operator's RoleBinding");
        let operator_kubeconfig = crate::service_account::service_account_kubeconfig(
            &client,
            (&setup.server, &setup.ca_pem),
            "perennial-system",
            "perennial-operator",
            &setup.dir,
        )
        .await;

        // The nodes as a cluster has them (KubeEdge registers each edge node), so that
        // kube-controller-manager's pod GC does not take the jobs' pods for orphans of nodes that
        // do not exist and delete them (40 s on).
        let node_objects: Api<Node> = Api::all(client.clone());
        let registered = futures::stream::iter(names.iter())
            .map(|name| {
                let node_objects = node_objects.clone();
                let object = json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {FLEET_LABEL: &namespace}}});
                async move {
                    let node: Node = serde_json::from_value(object).expect("a node");
                    node_objects.create(&PostParams::default(), &node).await.map_err(|e| format!("node {name}: {e}"))
                }
            })
            .buffer_unordered(API_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        if let Some(Err(err)) = registered.into_iter().find(Result::is_err) {
            panic!("registering the fleet's nodes: {err}");
        }

        // One Dataset and one job per node.
        let created = Instant::now();
        let datasets: Api<Dataset> = Api::namespaced(client.clone(), &namespace);
        let jobs: Api<LifelongLearningJob> = Api::namespaced(client.clone(), &namespace);
        let out = setup.dir.join("out");
        let made = futures::stream::iter(names.iter().enumerate())
            .map(|(i, node)| {
                let (datasets, jobs, out) = (datasets.clone(), jobs.clone(), out.clone());
                async move {
                    let (dataset, job) = objects(i, node, &out);
                    datasets.create(&PostParams::default(), &dataset).await.map_err(|e| format!("dataset {i}: {e}"))?;
                    jobs.create(&PostParams::default(), &job).await.map_err(|e| format!("job {i}: {e}"))?;
                    Ok::<(), String>(())
                }
            })
            .buffer_unordered(API_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        if let Some(Err(err)) = made.into_iter().find(Result::is_err) {
            panic!("creating the fleet's objects: {err}");
        }
        let create_secs = created.elapsed().as_secs_f64();

        // The nodes first (as a fleet that is there when the operator starts), then the operator.
        let pki = crate::link_support::pki();
        for (file, pem) in [("ca.pem", &pki.ca_pem), ("link.crt", &pki.cert_pem), ("link.key", &pki.key_pem)] {
            std::fs::write(setup.dir.join(file), pem).expect("pem");
        }
        let service = Service::start().await;
        let link_port = free_port_below_ephemeral();
        let url = format!("wss://localhost:{}/v1/link", if setup.through_service { service.port } else { link_port });
        let mut nodes = Vec::with_capacity(n);
        for (i, (name, token)) in names.iter().zip(&tokens).enumerate() {
            let state = NodeState {
                allocated: 0,
                outbox: BTreeMap::new(),
                desired_seq: 0,
                jobs: BTreeMap::new(),
                datasets: BTreeSet::new(),
                rounds_wanted: 0,
                samples: 0,
                synced_at: None,
                policy_at: None,
                reconnecting: None,
                resynced: Vec::new(),
                rounds_done_at: None,
                totals: totals.clone(),
            };
            // Each node its own TLS client (no TLS session shared with another node).
            let tls = perennial_link::socket::client_tls(pki.ca_pem.as_bytes()).expect("the link's CA");
            let settings = ClientSettings {
                url: url.clone(),
                server_name: None,
                token: TokenSource::Fixed(token.clone()),
                tls,
                node: name.clone(),
                min_backoff: Duration::from_millis(500),
                max_backoff: Duration::from_secs(60),
                policy_platform: None,
                downloads: None,
            };
            let events =
                Arc::new(Events { up: AtomicBool::new(false), ever: AtomicBool::new(false), totals: totals.clone() });
            let node = Arc::new(SimNode {
                name: name.clone(),
                job: format!("{namespace}/job-{i}"),
                state: Arc::new(Mutex::new(state)),
                outbox: Arc::new(Notify::new()),
                events,
                settings,
                running: Mutex::new(None),
            });
            node.start();
            nodes.push(node);
        }
        let started_nodes = Instant::now();
        let by_name: Arc<HashMap<String, Arc<SimNode>>> =
            Arc::new(nodes.iter().map(|node| (node.name.clone(), node.clone())).collect());

        let operator = spawn_operator(&setup, &operator_kubeconfig, "fleet", link_port);
        service.add(&operator);
        let nodes_before = started_nodes.elapsed();

        let run_pods = Arc::new(AtomicBool::new(true));
        let own_calls = Arc::new(AtomicU64::new(0));
        let pods_seen = Arc::new(PodsSeen::default());
        let kubelet = tokio::spawn(kubelet(
            Api::namespaced(client.clone(), &namespace),
            namespace.clone(),
            by_name,
            run_pods.clone(),
            own_calls.clone(),
            pods_seen.clone(),
        ));
        let mut fleet = Fleet {
            setup,
            operator,
            operator_kubeconfig,
            service,
            nodes,
            totals,
            run_pods,
            own_calls,
            pods_seen,
            played: 0,
            kubelet,
            http: reqwest::Client::new(),
            figures: Vec::new(),
        };
        let mut figures = fleet.figures("create");
        figures.seconds = create_secs;
        figures.extra.push(("objects".into(), format!("{}", 2 * n)));
        figures.extra.push(("objects_per_s".into(), format!("{:.0}", 2.0 * n as f64 / create_secs)));
        figures.extra.push(("token_secret_bytes".into(), secret_bytes.to_string()));
        fleet.print(figures);

        // Connected and synced: every node holds its job and dataset, and each job has its
        // status (the notice of Train, round 0).
        let limit = Duration::from_secs(120 + n as u64 / 20);
        fleet
            .until("every node connected and holding its job", limit, |fleet| fleet.synced() == fleet.nodes.len())
            .await;
        let synced = fleet.operator.started.elapsed();
        let mut figures = fleet.figures("connect");
        figures.seconds = synced.as_secs_f64();
        figures.extra.push(("nodes_started_before_operator_s".into(), format!("{:.1}", nodes_before.as_secs_f64())));
        figures.extra.push(("connects".into(), fleet.totals.connects.load(Ordering::Relaxed).to_string()));
        fleet.print(figures);
        // Every job's status written (Train Waiting on its node), and the nodes' first reports
        // (their policies) applied: the time from the operator's start.
        let waiting = |fleet: &Fleet| {
            let held =
                |node: &Arc<SimNode>| lock(&node.state).jobs.values().all(|job| job.notice == Some((Stage::Train, 0)));
            fleet.nodes.iter().filter(|node| held(node)).count()
        };
        let every = |fleet: &Fleet| waiting(fleet) == fleet.nodes.len();
        let status_limit = Duration::from_secs(120 + n as u64 / 5);
        fleet.until("every job's status written (Train Waiting on every node)", status_limit, every).await;
        fleet.until("every node's reports acknowledged", limit, |fleet| fleet.outboxes() == 0).await;
        let mut figures = fleet.figures("status");
        figures.seconds = fleet.operator.started.elapsed().as_secs_f64();
        fleet.print(figures);
        fleet
    }

    fn figures(&self, phase: &str) -> Figures {
        Figures {
            phase: phase.to_owned(),
            nodes: self.nodes.len(),
            connected: self.totals.connected.load(Ordering::Relaxed),
            rss_mib: self.operator.rss_mib(),
            load: measure::load_average(),
            ..Figures::default()
        }
    }

    fn print(&mut self, figures: Figures) {
        println!("{figures}");
        self.figures.push(figures);
    }

    fn synced(&self) -> usize {
        self.nodes.iter().filter(|node| lock(&node.state).synced_at.is_some()).count()
    }

    /// Whether a train pod was seen for each (job, round) of `wanted`.
    fn train_pods_seen(&self, wanted: &[(String, u64)]) -> bool {
        let seen = self.pods_seen.lock().unwrap_or_else(|p| p.into_inner());
        let prefix = format!("{}/", self.setup.namespace);
        wanted.iter().all(|(job, round)| {
            let name = job.strip_prefix(&prefix).unwrap_or(job);
            seen.contains_key(&(name.to_owned(), round.to_string(), "train".to_owned()))
        })
    }

    fn outboxes(&self) -> usize {
        self.nodes.iter().map(|node| lock(&node.state).outbox.len()).sum()
    }

    /// Waits until `done`, every 200 ms; panics after `limit` (or as soon as the operator exits).
    async fn until(&mut self, what: &str, limit: Duration, done: impl Fn(&Fleet) -> bool) {
        let deadline = Instant::now() + limit;
        loop {
            if done(self) {
                return;
            }
            if let Some(exited) = self.operator.exited() {
                panic!("waiting for {what}: {exited}");
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out after {limit:?} waiting for {what}: {} of {} nodes connected, {} synced, {} reports \
                     unacknowledged\n{}",
                    self.totals.connected.load(Ordering::Relaxed),
                    self.nodes.len(),
                    self.synced(),
                    self.outboxes(),
                    self.operator.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Nodes connected, heartbeats only, for `length`: the operator's RSS and CPU, the link's
    /// bytes per node per second each way.
    pub async fn idle(&mut self, length: Duration) -> Figures {
        let port = self.operator.link_port;
        let (up0, down0, _) = link_bytes(port);
        let (cpu0, connects0, started) = (self.operator.cpu_seconds(), self.connects(), Instant::now());
        tokio::time::sleep(length).await;
        let (up1, down1, connections) = link_bytes(port);
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = self.operator.cpu_seconds() - cpu0;
        let n = self.nodes.len() as f64;
        let mut figures = self.figures("idle");
        figures.seconds = elapsed;
        figures.cpu_per_min = Some(cpu / elapsed * 60.0);
        figures.kbit_up = Some(up1.saturating_sub(up0) as f64 * 8.0 / 1000.0 / elapsed / n);
        figures.kbit_down = Some(down1.saturating_sub(down0) as f64 * 8.0 / 1000.0 / elapsed / n);
        figures.extra.push(("link_connections".into(), connections.to_string()));
        figures.extra.push(("reconnects".into(), (self.connects() - connects0).to_string()));
        if let Some(exited) = self.operator.exited() {
            panic!("while idle: {exited}");
        }
        // Every status write is shown by the job watch by now: one kept is a job held twice.
        let metric = "perennial_operator_written_jobs_kept";
        let kept = measure::operator_metric(&self.http, self.operator.metrics_port, metric).await;
        figures.extra.push(("written_jobs_kept".into(), format!("{kept:?}")));
        assert_eq!(
            kept,
            Some(0.0),
            "after idling, the operator still keeps status writes the job watch shows ({metric})"
        );
        self.print(figures.clone());
        figures
    }

    /// Waits until the operator has no Event left to publish.
    async fn events_sent(&self, limit: Duration) {
        let metric = "perennial_operator_events_queued";
        let deadline = Instant::now() + limit;
        loop {
            // `None`: not read (a slow /metrics at fleet size: read again), or an older binary
            // given to the bench, which has no such metric.
            let queued = measure::operator_metric(&self.http, self.operator.metrics_port, metric).await;
            match queued {
                Some(queued) if queued <= 0.0 => return,
                None if std::env::var_os("PERENNIAL_BENCH_BINARY").is_some() => return,
                _ => {}
            }
            assert!(Instant::now() < deadline, "{metric} still {queued:?} after {limit:?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn connects(&self) -> u64 {
        self.totals.connects.load(Ordering::Relaxed)
    }

    /// A policy change on every job (its trigger's threshold): the time until every node holds
    /// it (and serves it: the stand-in reports the new config in `status.policies`).
    pub async fn policy_change(&mut self) -> Figures {
        let jobs: Api<LifelongLearningJob> = Api::namespaced(self.setup.client.clone(), &self.setup.namespace);
        let started = Instant::now();
        let patch = json!({"spec": {"trainSpec": {"trigger": {"condition": {"threshold": CHANGED_THRESHOLD}}}}});
        let patched = futures::stream::iter(0..self.nodes.len())
            .map(|i| {
                let (jobs, patch) = (jobs.clone(), patch.clone());
                async move { jobs.patch(&format!("job-{i}"), &PatchParams::default(), &Patch::Merge(&patch)).await }
            })
            .buffer_unordered(API_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        if let Some(Err(err)) = patched.into_iter().find(Result::is_err) {
            panic!("changing the jobs' trigger: {err}");
        }
        let patch_secs = started.elapsed().as_secs_f64();
        let limit = Duration::from_secs(120 + self.nodes.len() as u64 / 20);
        self.until("every node holding the changed policy", limit, |fleet| {
            fleet.nodes.iter().all(|node| lock(&node.state).policy_at.is_some())
        })
        .await;
        let last = self.nodes.iter().filter_map(|node| lock(&node.state).policy_at).max().unwrap_or(started);
        let mut times: Vec<f64> = self
            .nodes
            .iter()
            .filter_map(|node| lock(&node.state).policy_at)
            .map(|at| at.saturating_duration_since(started).as_secs_f64())
            .collect();
        times.sort_by(f64::total_cmp);
        let mut figures = self.figures("policy");
        figures.seconds = last.saturating_duration_since(started).as_secs_f64();
        figures.extra.push(("patch_all_jobs_s".into(), format!("{patch_secs:.1}")));
        figures.extra.push(("p50_node_s".into(), format!("{:.1}", times.get(times.len() / 2).copied().unwrap_or(0.0))));
        self.until("the policies' reports acknowledged", limit, |fleet| fleet.outboxes() == 0).await;
        self.print(figures.clone());
        figures
    }

    /// `nodes` nodes that have not played yet play one round of their job (`again`: nodes that
    /// have, the first ones, another round), `at_once` at a time (`full`: Train Ready to
    /// deployed, the fleet playing the kubelet and the workers; else Train Ready to the train pod
    /// created, left Pending). API requests and the API server's CPU per job-round.
    pub async fn rounds(&mut self, nodes: usize, at_once: usize, full: bool, again: bool) -> Figures {
        // The next nodes that have not played yet: each phase's rounds are first rounds, which
        // delete nothing. Played again, a round deletes the round before's inference pod.
        let (first, left) = if again { (0, self.played) } else { (self.played, self.nodes.len() - self.played) };
        if left == 0 {
            let why = if again { "no node has played a round yet" } else { "every node has played its round already" };
            println!("fleet rounds   skipped: {why}");
            return self.figures(if again { "rounds_again" } else { "rounds" });
        }
        let count = nodes.clamp(1, left);
        if !again {
            self.played = first + count;
        }
        let playing: Vec<Arc<SimNode>> = self.nodes[first..first + count].to_vec();
        self.run_pods.store(full, Ordering::Relaxed);
        // In waves of `at_once`, each after the one before is deployed: every job's round without
        // the burst of all of them at once (which at 10,000 kept the API server from renewing the
        // Lease), or one job alone after another.
        let wave = at_once.clamp(1, count);
        let limit = Duration::from_secs(300 + wave as u64 / 2);
        // The Events of the phases before (a start's first Waiting of each job) sent first: still
        // queued, they were counted as the rounds' (7 a job-round at 10,000 nodes).
        self.events_sent(limit).await;
        let state = self.setup.k8s_state.clone();
        let before = measure::apiserver_requests(&self.setup.client).await;
        let operator_before = measure::operator_requests(&self.http, self.operator.metrics_port).await;
        let own_before = self.own_calls.load(Ordering::Relaxed);
        let cpu_before = state.as_deref().and_then(measure::control_plane_cpu);
        let operator_cpu_before = self.operator.cpu_seconds();
        let started = Instant::now();
        if full {
            for (index, wave) in playing.chunks(wave).enumerate() {
                start_rounds(wave);
                let what = format!("wave {}'s rounds deployed ({} nodes)", index + 1, wave.len());
                self.until(&what, limit, |_| wave.iter().all(|node| lock(&node.state).rounds_done_at.is_some())).await;
            }
        } else {
            let wanted = start_rounds(&playing);
            self.until("a train pod for every playing job", limit, |fleet| fleet.train_pods_seen(&wanted)).await;
        }
        let elapsed = started.elapsed();
        self.until("the rounds' reports acknowledged", limit, |fleet| fleet.outboxes() == 0).await;
        // The operator's writes settle (Events go off the reconcile path).
        let mut settled = measure::operator_requests(&self.http, self.operator.metrics_port).await;
        for _ in 0..60 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let now = measure::operator_requests(&self.http, self.operator.metrics_port).await;
            let quiet = now.iter().all(|(key, count)| key.contains("leases") || settled.get(key) == Some(count));
            settled = now;
            if quiet {
                break;
            }
        }
        let after = measure::apiserver_requests(&self.setup.client).await;
        let own = (self.own_calls.load(Ordering::Relaxed) - own_before) as f64;
        let cpu_after = state.as_deref().and_then(measure::control_plane_cpu);
        let operator_cpu = self.operator.cpu_seconds() - operator_cpu_before;
        let total: f64 = measure::grown(&after, &before).values().sum();
        let operator_total: f64 = measure::grown(&settled, &operator_before).values().sum();
        let per = count as f64;
        let mut figures = self.figures(match (full, again) {
            (false, _) => "train",
            (true, false) => "rounds",
            (true, true) => "rounds_again",
        });
        figures.seconds = elapsed.as_secs_f64();
        figures.job_rounds = Some(count);
        if full && wave < count {
            figures.extra.push(("at_once".into(), wave.to_string()));
        }
        // The fleet's own calls (the kubelet's, and the two reads of /metrics) are not the
        // operator's cost.
        figures.requests_per_job_round = Some((total - own - 2.0) / per);
        figures.operator_requests_per_job_round = Some(operator_total / per);
        if let (Some((api0, etcd0)), Some((api1, etcd1))) = (cpu_before, cpu_after) {
            figures.apiserver_cpu_per_job_round = Some((api1 - api0) / per);
            figures.etcd_cpu_per_job_round = Some((etcd1 - etcd0) / per);
        }
        figures.extra.push(("operator_cpu_s_per_job_round".into(), format!("{:.4}", operator_cpu / per)));
        figures.extra.push(("kubelet_requests_per_job_round".into(), format!("{:.1}", own / per)));
        let mut breakdown: Vec<(String, f64)> =
            measure::grown(&settled, &operator_before).into_iter().map(|(k, v)| (k, v / per)).collect();
        breakdown.sort_by(|a, b| b.1.total_cmp(&a.1));
        let shown: Vec<String> =
            breakdown.iter().take(6).map(|(k, v)| format!("{}:{v:.2}", k.replace(' ', "_"))).collect();
        figures.extra.push(("operator_top".into(), shown.join(",")));
        self.print(figures.clone());
        figures
    }

    /// Nodes drop and reconnect at `per_second` for `length`; each queues a report (its dataset's
    /// count) just before it goes. The time from a reconnect to the node's desired state applied.
    pub async fn churn(&mut self, length: Duration, per_second: f64) -> Figures {
        let (cpu0, connects0) = (self.operator.cpu_seconds(), self.connects());
        let started = Instant::now();
        let interval = Duration::from_secs_f64(1.0 / per_second.max(0.01));
        let mut tasks = Vec::new();
        let mut next = 0usize;
        let mut random = [0u8; 8];
        while started.elapsed() < length {
            getrandom::fill(&mut random).expect("random");
            let pick = u64::from_le_bytes(random) as usize % self.nodes.len();
            let node = self.nodes[(pick + next) % self.nodes.len()].clone();
            next += 1;
            {
                let mut state = lock(&node.state);
                state.samples += 1;
                let samples = state.samples;
                let dataset = state.jobs.values().next().map(|job| job.dataset.clone()).unwrap_or_default();
                state.queue(json!({"dataset": dataset, "numberOfSamples": samples}));
            }
            node.outbox.notify_one();
            tasks.push(tokio::spawn(async move { node.reconnect(Duration::from_millis(200)).await }));
            tokio::time::sleep(interval).await;
            if let Some(exited) = self.operator.exited() {
                panic!("during churn: {exited}");
            }
        }
        for task in tasks {
            let _ = task.await;
        }
        let churned = self.connects() - connects0;
        let limit = Duration::from_secs(120 + self.nodes.len() as u64 / 20);
        self.until("every node connected again after the churn", limit, |fleet| {
            fleet.totals.connected.load(Ordering::Relaxed) == fleet.nodes.len()
        })
        .await;
        self.until("every report acknowledged after the churn", limit, |fleet| fleet.outboxes() == 0).await;
        let elapsed = started.elapsed().as_secs_f64();
        let mut resynced: Vec<f64> = self
            .nodes
            .iter()
            .flat_map(|node| std::mem::take(&mut lock(&node.state).resynced))
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect();
        resynced.sort_by(f64::total_cmp);
        let pct = |p: f64| resynced.get(((resynced.len() as f64 * p) as usize).min(resynced.len().saturating_sub(1)));
        let mut figures = self.figures("churn");
        figures.seconds = elapsed;
        figures.cpu_per_min = Some((self.operator.cpu_seconds() - cpu0) / elapsed * 60.0);
        figures.extra.push(("reconnects".into(), churned.to_string()));
        figures.extra.push(("rate_per_s".into(), format!("{per_second:.1}")));
        figures.extra.push(("resync_ms_p50".into(), format!("{:.0}", pct(0.5).copied().unwrap_or(f64::NAN))));
        figures.extra.push(("resync_ms_max".into(), format!("{:.0}", resynced.last().copied().unwrap_or(f64::NAN))));
        self.print(figures.clone());
        figures
    }

    /// Failover at fleet size: a standby started beside the leader; `share` of the nodes (the
    /// last ones) start a round, and once each has its train pod the leader is SIGKILLed; every
    /// node queues a report (its dataset's count) while no replica leads. The standby takes the
    /// Lease, every node reconnects (through the Service, or to the port the standby takes) and
    /// resyncs, every report is applied once, and the rounds complete. Figures: kill -> standby leads, kill -> every node resynced
    /// (p50 and the last), and the new leader's API requests until then (none is per node).
    pub async fn failover(&mut self, share: f64) -> Figures {
        // Through the Service, or (when this process cannot hold its two sockets a node) on the
        // leader's own link port, which the standby binds once it leads: the same one address
        // that leads to whichever replica leads, refused while none does.
        let link_port = if self.setup.through_service { free_port() } else { self.operator.link_port };
        let standby = spawn_operator(&self.setup, &self.operator_kubeconfig, "fleet-standby", link_port);
        self.service.add(&standby);
        let metrics = format!("http://127.0.0.1:{}/metrics", standby.metrics_port);
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.http.get(&metrics).send().await.is_err() {
            assert!(Instant::now() < deadline, "the standby never answered on /metrics");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let count = ((self.nodes.len() as f64 * share).round() as usize).min(self.nodes.len());
        let playing: Vec<Arc<SimNode>> = self.nodes.iter().rev().take(count).cloned().collect();
        let limit = Duration::from_secs(300 + self.nodes.len() as u64 / 20);
        if !playing.is_empty() {
            self.run_pods.store(true, Ordering::Relaxed);
            let wanted = start_rounds(&playing);
            self.until("a train pod for every playing job", limit, |fleet| fleet.train_pods_seen(&wanted)).await;
        }
        let requests_before = measure::operator_requests(&self.http, standby.metrics_port).await;
        let killed = Instant::now();
        // SIGKILL (Child::kill): no Lease released, no connection closed politely.
        let _ = self.operator.child.kill();
        let _ = self.operator.child.wait();
        let dropped = Instant::now() + Duration::from_secs(30);
        while self.totals.connected.load(Ordering::Relaxed) > 0 && Instant::now() < dropped {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let reconnects0 = self.connects();
        for node in &self.nodes {
            let mut state = lock(&node.state);
            state.reconnecting = Some(killed);
            state.resynced.clear();
            state.samples += 1;
            let samples = state.samples;
            let dataset = state.jobs.values().next().map(|job| job.dataset.clone()).unwrap_or_default();
            state.queue(json!({"dataset": dataset, "numberOfSamples": samples}));
        }
        let old = std::mem::replace(&mut self.operator, standby);
        drop(old);
        let http = self.http.clone();
        let deadline = Instant::now() + limit;
        while !leads(&http, self.operator.metrics_port).await {
            if let Some(exited) = self.operator.exited() {
                panic!("the standby, taking over: {exited}");
            }
            assert!(Instant::now() < deadline, "the standby never took the Lease\n{}", self.operator.tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let leads_after = killed.elapsed();
        self.until("every node resynced on the new leader", limit, |fleet| {
            fleet.nodes.iter().all(|node| lock(&node.state).reconnecting.is_none())
        })
        .await;
        let mut resynced: Vec<f64> = self
            .nodes
            .iter()
            .flat_map(|node| lock(&node.state).resynced.clone())
            .map(|since_kill| since_kill.as_secs_f64())
            .collect();
        resynced.sort_by(f64::total_cmp);
        // Said now: what comes after (the reports, the rounds) may not finish.
        println!(
            "fleet failover: the standby leads {:.1} s after the kill; every node resynced {:.1} s after it (p50 {:.1} s)",
            leads_after.as_secs_f64(),
            resynced.last().copied().unwrap_or(f64::NAN),
            resynced.get(resynced.len() / 2).copied().unwrap_or(f64::NAN)
        );
        let requests_after = measure::operator_requests(&self.http, self.operator.metrics_port).await;
        let grown = measure::grown(&requests_after, &requests_before);
        // Its reads: what a takeover costs whatever the reports (a list and a watch per kind, not
        // a read per node); its writes are what the reports and rounds ask for.
        let reads: f64 = grown
            .iter()
            .filter(|(key, _)| ["get ", "list ", "watch "].iter().any(|verb| key.starts_with(verb)))
            .map(|(_, n)| n)
            .sum();
        let mut breakdown: Vec<(&String, &f64)> = grown.iter().collect();
        breakdown.sort_by(|a, b| b.1.total_cmp(a.1));
        let shown: Vec<String> =
            breakdown.iter().take(6).map(|(k, v)| format!("{}:{v:.0}", k.replace(' ', "_"))).collect();
        self.until("every report acknowledged after the failover", limit, |fleet| fleet.outboxes() == 0).await;
        if !playing.is_empty() {
            self.until("every playing node's round deployed after the failover", limit, |_| {
                playing.iter().all(|node| lock(&node.state).rounds_done_at.is_some())
            })
            .await;
        }
        let mut figures = self.figures("failover");
        figures.seconds = resynced.last().copied().unwrap_or(f64::NAN);
        figures.extra.push(("standby_leads_s".into(), format!("{:.1}", leads_after.as_secs_f64())));
        let p50 = resynced.get(resynced.len() / 2).copied().unwrap_or(f64::NAN);
        figures.extra.push(("resynced_s_p50".into(), format!("{p50:.1}")));
        figures.extra.push(("mid_round_jobs".into(), count.to_string()));
        let through = if self.setup.through_service { "service" } else { "shared_port" };
        figures.extra.push(("through".into(), through.into()));
        figures.extra.push(("reconnects".into(), (self.connects() - reconnects0).to_string()));
        figures.extra.push(("new_leader_reads".into(), format!("{reads:.0}")));
        figures.extra.push(("new_leader_top".into(), shown.join(",")));
        self.print(figures.clone());
        figures
    }

    /// What must hold after any phase: the operator runs, every node connected, every report
    /// acknowledged and none refused, no step done twice (one pod per job, round and worker
    /// type), and each Dataset's count the last its node sent.
    pub async fn problems(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(exited) = self.operator.exited() {
            problems.push(exited);
        }
        let never: Vec<&str> = self
            .nodes
            .iter()
            .filter(|node| !node.events.ever.load(Ordering::Relaxed))
            .map(|node| node.name.as_str())
            .collect();
        if !never.is_empty() {
            problems.push(format!("{} node(s) never connected: {:?}", never.len(), &never[..never.len().min(10)]));
        }
        let unacked = self.outboxes();
        if unacked > 0 {
            problems.push(format!("{unacked} report(s) never acknowledged"));
        }
        let rejected = self.totals.rejected.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if !rejected.is_empty() {
            problems.push(format!(
                "{} report(s) refused (lost): {:?}",
                rejected.len(),
                &rejected[..rejected.len().min(5)]
            ));
        }
        let doubled: Vec<String> = self
            .pods_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, pods)| pods.len() > 1)
            .map(|((job, round, kind), pods)| format!("{job} round {round}: {} {kind} pods", pods.len()))
            .collect();
        if !doubled.is_empty() {
            problems.push(format!("steps done twice: {:?}", &doubled[..doubled.len().min(10)]));
        }
        // Every count a node sent is its Dataset's status (the last one, none lost).
        let datasets: Api<Dataset> = Api::namespaced(self.setup.client.clone(), &self.setup.namespace);
        let mut wrong = Vec::new();
        for _ in 0..30 {
            let listed = datasets.list(&ListParams::default()).await.expect("list the datasets");
            let counts: HashMap<String, i64> = listed
                .items
                .iter()
                .map(|d| {
                    let name = d.metadata.name.clone().unwrap_or_default();
                    (name, d.status.as_ref().map_or(0, |s| s.number_of_samples))
                })
                .collect();
            wrong = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, node)| {
                    let sent = lock(&node.state).samples as i64;
                    let shown = counts.get(&format!("job-{i}-data")).copied().unwrap_or(-1);
                    (sent != shown).then(|| format!("job-{i}-data: {shown}, its node sent {sent}"))
                })
                .collect();
            if wrong.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if !wrong.is_empty() {
            problems.push(format!(
                "{} dataset(s) whose count is not the last its node sent (a report lost): {:?}",
                wrong.len(),
                &wrong[..wrong.len().min(10)]
            ));
        }
        problems
    }

    /// Stops the nodes and the kubelet, and removes the fleet's Node objects; the operator is
    /// killed when the fleet is dropped.
    pub async fn stop(self) {
        for node in &self.nodes {
            node.stop();
        }
        self.kubelet.abort();
        let selector = format!("{FLEET_LABEL}={}", self.setup.namespace);
        let nodes: Api<Node> = Api::all(self.setup.client.clone());
        let _ = nodes.delete_collection(&DeleteParams::default(), &ListParams::default().labels(&selector)).await;
    }
}

/// The kubelet and the workers: each new pod of the jobs is marked Running, a train or eval
/// worker's result goes to its node (which relays it over the link), then the pod Succeeded; an
/// inference pod stays Running. A pod being deleted is removed at once. Without `run_pods`, pods
/// are only noted (left Pending).
async fn kubelet(
    pods: Api<Pod>,
    namespace: String,
    nodes: Arc<HashMap<String, Arc<SimNode>>>,
    run_pods: Arc<AtomicBool>,
    own_calls: Arc<AtomicU64>,
    seen: Arc<PodsSeen>,
) {
    let mut handled = BTreeSet::new();
    let owned = watcher::Config::default().labels("lifelonglearningjob.sedna.io/uid");
    let mut stream = watcher(pods.clone(), owned).boxed();
    let limit = Arc::new(Semaphore::new(API_CONCURRENCY));
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            _ => continue,
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        let label = |key: &str| pod.metadata.labels.as_ref().and_then(|l| l.get(key)).cloned().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            if handled.insert(format!("deleted/{name}")) {
                let (pods, own_calls) = (pods.clone(), own_calls.clone());
                tokio::spawn(async move {
                    own_calls.fetch_add(1, Ordering::Relaxed);
                    let _ =
                        pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
                });
            }
            continue;
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !handled.insert(uid.clone()) {
            // These Nodes never post a status, so kube-controller-manager's node lifecycle
            // controller marks some of their pods NotReady; the kubelet running the pod says it
            // is Ready again (an inference pod not Ready is not deployed: its job waited forever).
            // (Inference pods only: a train or eval pod goes on to Succeeded, which this must not undo.)
            let inference = label("lifelonglearningjob.sedna.io/worker-type") == "inference";
            if inference && run_pods.load(Ordering::Relaxed) && marked_not_ready(&pod) {
                let (pods, own_calls) = (pods.clone(), own_calls.clone());
                tokio::spawn(async move {
                    own_calls.fetch_add(1, Ordering::Relaxed);
                    let _ = pods
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::running()))
                        .await;
                });
            }
            continue;
        }
        let job = label("lifelonglearningjob.sedna.io/name");
        let kind = label("lifelonglearningjob.sedna.io/worker-type");
        let round = label(perennial_workers::pod::ROUND_LABEL);
        seen.lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((job, round.clone(), kind.clone()))
            .or_default()
            .insert(uid);
        if !run_pods.load(Ordering::Relaxed) {
            continue;
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let Some(node) = nodes.get(&node).cloned() else { continue };
        let (pods, namespace, own_calls, limit) = (pods.clone(), namespace.clone(), own_calls.clone(), limit.clone());
        tokio::spawn(async move {
            let Ok(_permit) = limit.acquire().await else { return };
            own_calls.fetch_add(1, Ordering::Relaxed);
            let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::running())).await;
            if kind != "train" && kind != "eval" {
                return;
            }
            node.worker_report(&pod, &namespace, &kind, round.parse().unwrap_or(0));
            own_calls.fetch_add(1, Ordering::Relaxed);
            let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::succeeded())).await;
        });
    }
}

/// A running pod whose Ready condition someone else turned False.
fn marked_not_ready(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else { return false };
    status.phase.as_deref() == Some("Running")
        && status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "False")
}

/// Node `i`'s Dataset and job (Sedna's fields; the job's pods placed on the node).
fn objects(i: usize, node: &str, out: &Path) -> (Dataset, LifelongLearningJob) {
    let name = format!("job-{i}");
    let template = |kind: &str| {
        json!({"spec": {"nodeName": node, "containers": [
            {"name": kind, "image": "kubeedge/sedna-example-lifelong-learning-atcii-classifier:v0.5.0",
             "args": [format!("{kind}.py")]}]}})
    };
    let dataset = json!({"apiVersion": "sedna.io/v1alpha1", "kind": "Dataset",
        "metadata": {"name": format!("{name}-data")},
        "spec": {"url": format!("/data/{name}/index.txt"), "format": "txt", "nodeName": node}});
    let job = json!({"apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob",
        "metadata": {"name": name},
        "spec": {
            "dataset": {"name": format!("{name}-data"), "trainProb": 0.8},
            "trainSpec": {"template": template("train"), "trigger": {
                "checkPeriodSeconds": 60,
                "condition": {"operator": ">=", "threshold": THRESHOLD, "metric": "num_of_samples"}}},
            "evalSpec": {"template": template("eval")},
            "deploySpec": {"template": template("infer")},
            "outputDir": out.join(&name)}});
    (serde_json::from_value(dataset).expect("dataset"), serde_json::from_value(job).expect("job"))
}
