//! The cluster half on a real Kubernetes API server: `cargo bench -p perennial --bench cluster`
//! with `PERENNIAL_BENCH_KUBECONFIG` (or `PERENNIAL_TEST_KUBECONFIG`) naming an admin kubeconfig
//! (e.g. `../shared/k8s/up --state /tmp/k8s-bench --port 6460 --etcd-port 12400`, then
//! `PERENNIAL_BENCH_KUBECONFIG=/tmp/k8s-bench/kubeconfig`).
//!
//! `perennial operator` runs as its ServiceAccount (deploy/operator's RBAC), linked
//! `perennial edge` processes run with their default flags (`--poll-ms` included), and the bench
//! plays the kubelet and instant workers (pod status patched at once, Sedna's report posted to
//! the pod's node's agent at once). Two scenarios, the same procedure:
//!
//! - alone: 1 job, 1 edge, `PERENNIAL_BENCH_ROUNDS_ALONE` rounds (20);
//! - many: 100 jobs over 10 edges (10 a node, each job its own Dataset), one operator,
//!   `PERENNIAL_BENCH_ROUNDS_MANY` rounds (3), all jobs' samples appended at once.
//!
//! - compiling: the alone scenario again, while the operator (given `--sign-key`) compiles a
//!   Python trigger (`perennial plugin new --lang python`, on a real S3 server) for two nodes of
//!   two platforms (this machine's, and pulley64) that hold a job with it: a round's time and the
//!   operator's RSS (its largest, sampled each round, and once both nodes fetched the artifacts)
//!   beside the alone scenario's. Those two nodes stand for boards of their own: they run at
//!   `SCHED_IDLE`, so that their work with the policy is not counted as the control plane's.
//!
//! `PERENNIAL_BENCH_ONLY=alone|many|compiling` runs one of them; `PERENNIAL_BENCH_BINARY` runs another
//! `perennial` binary than this build's (a build before a change, say). Printed: the control-plane time of a round
//! (samples appended -> round deployed), each stage hop, the operator's RSS idle and after the
//! rounds, the API server's requests per job-round (`apiserver_request_total`, the bench's own
//! kubelet calls taken out), the operator's own by verb and resource (its
//! `perennial_operator_api_requests_total`), and the CPU seconds per job-round of kube-apiserver
//! and etcd (`/proc/PID/stat`, their pids from the `up` state directory: `PERENNIAL_BENCH_K8S_STATE`,
//! else the kubeconfig's directory) beside the operator's. Load averages are printed with them.

// The rcgen CA of the link tests (its test cloud is not used here), the workers as the cluster
// tests play them, and the ServiceAccount kubeconfig they run the operator with.
#[path = "support/api_server.rs"]
mod api_server;
#[allow(dead_code)]
#[path = "../../../tests/support/link.rs"]
mod link_support;
#[path = "../../../tests/support/measure.rs"]
mod measure;
#[path = "../../../tests/support/plugin_projects.rs"]
mod plugin_projects;
#[path = "../../../tests/support/s3.rs"]
mod s3;
#[path = "../../../tests/support/sedna_worker.rs"]
mod sedna_worker;
#[path = "../../../tests/support/service_account.rs"]
mod service_account;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use api_server::Cluster;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use measure::{cpu_seconds, load_average, operator_requests};
use perennial_api::LifelongLearningJob;
use serde_json::{Value, json};

/// Samples appended a round, and the trigger's threshold (Sedna's `num_of_samples >=`).
const SAMPLES: usize = 50;
const THRESHOLD: u32 = 40;
/// The whole bench stops by itself after this.
const WATCHDOG: Duration = Duration::from_secs(40 * 60);
/// The longest the compiling scenario's rounds go on waiting for its compiles.
const COMPILES_WAITED: Duration = Duration::from_secs(20 * 60);

/// Child processes, killed at the end, on a panic and by the watchdog.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn main() {
    perennial_tls::install_crypto_provider();
    let kubeconfig = ["PERENNIAL_BENCH_KUBECONFIG", "PERENNIAL_TEST_KUBECONFIG"]
        .iter()
        .find_map(std::env::var_os)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            eprintln!(
                "the cluster bench needs a Kubernetes API server: set PERENNIAL_BENCH_KUBECONFIG (or \
                 PERENNIAL_TEST_KUBECONFIG) to an admin kubeconfig, e.g. after \
                 `../shared/k8s/up --state /tmp/k8s-bench --port 6460 --etcd-port 12400`: \
                 PERENNIAL_BENCH_KUBECONFIG=/tmp/k8s-bench/kubeconfig"
            );
            std::process::exit(2)
        });
    std::thread::spawn(|| {
        std::thread::sleep(WATCHDOG);
        eprintln!("the cluster bench did not finish within {WATCHDOG:?}: stopping");
        kill_children();
        std::process::exit(1);
    });
    let only = std::env::var("PERENNIAL_BENCH_ONLY").unwrap_or_default();
    let rounds = |name: &str, default: usize| {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(default)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(async {
            let cluster = Cluster::new(kubeconfig).await;
            cluster.install();
            let mut results = Vec::new();
            let alone = rounds("PERENNIAL_BENCH_ROUNDS_ALONE", 20);
            if only.is_empty() || only == "alone" || only == "compiling" {
                results.push(scenario(&cluster, "1 job alone", 1, 1, alone, None).await);
            }
            if only.is_empty() || only == "compiling" {
                let load = CompileLoad::new().await;
                let label = "1 job alone, while the operator compiles a Python policy for 2 platforms";
                results.push(scenario(&cluster, label, 1, 1, alone, Some(&load)).await);
            }
            if only.is_empty() || only == "many" {
                results.push(
                    scenario(&cluster, "100 jobs / 10 edges", 10, 10, rounds("PERENNIAL_BENCH_ROUNDS_MANY", 3), None)
                        .await,
                );
            }
            print_results(&results);
        })
    }));
    drop(runtime);
    kill_children();
    if outcome.is_err() {
        std::process::exit(1);
    }
}

fn kill_children() {
    for pid in CHILDREN.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
        // SAFETY: kill(2) on a pid this process started; at worst it has exited already.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
}

// ---------------------------------------------------------------- the API server and its parts

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// A `perennial` child process, its output in a log file; killed when dropped.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn start(args: &[String], log: PathBuf) -> Process {
        Process::start_with(args, log, &[])
    }

    fn start_with(args: &[String], log: PathBuf, env: &[(String, String)]) -> Process {
        Process::spawn(Process::command(), args, log, env)
    }

    /// A process that stands for another machine (a node whose work is not the control plane's):
    /// at `SCHED_IDLE`, so that on this machine's shared cores it takes only what nothing
    /// measured wants.
    fn start_elsewhere(args: &[String], log: PathBuf, env: &[(String, String)]) -> Process {
        use std::os::unix::process::CommandExt;
        let mut command = Process::command();
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::setpriority(libc::PRIO_PROCESS, 0, 19);
                let param = libc::sched_param { sched_priority: 0 };
                libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
                Ok(())
            });
        }
        Process::spawn(command, args, log, env)
    }

    fn command() -> Command {
        // Another build's binary may be measured with this bench (before and after a change).
        let binary =
            std::env::var_os("PERENNIAL_BENCH_BINARY").unwrap_or_else(|| env!("CARGO_BIN_EXE_perennial").into());
        Command::new(binary)
    }

    fn spawn(mut command: Command, args: &[String], log: PathBuf, env: &[(String, String)]) -> Process {
        let file = std::fs::File::create(&log).expect("log file");
        let child = command
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(name, value)| (name, value)))
            .env_remove("KUBECONFIG")
            .stdout(Stdio::from(file.try_clone().expect("log")))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start perennial");
        CHILDREN.lock().unwrap_or_else(|p| p.into_inner()).push(child.id());
        Process { child, log }
    }

    fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id()).unwrap_or(f64::NAN)
    }

    /// VmRSS, in MiB.
    fn rss_mib(&self) -> f64 {
        measure::rss_mib(self.child.id())
    }

    /// RssAnon, in MiB (VmRSS without the program's own pages).
    fn rss_anon_mib(&self) -> f64 {
        measure::rss_anon_mib(self.child.id())
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!("----- {} -----\n{}", self.log.display(), lines[lines.len().saturating_sub(30)..].join("\n"))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- what was seen, and when

#[derive(Clone, Debug, PartialEq)]
enum Seen {
    /// The job's status moved to (stage, phase).
    Status(String, String),
    /// `status.deployed.round`.
    Deployed(u64),
    Pod(&'static str),
    TrainDone,
    EvalDone,
    InferReady,
}

/// Everything seen, by job name, in order.
#[derive(Default)]
struct Log {
    events: Mutex<HashMap<String, Vec<(Instant, Seen)>>>,
    /// The last (stage, phase, deployed round) of each job.
    last: Mutex<HashMap<String, (String, String, u64)>>,
    /// The bench's own API calls (the kubelet's), by "VERB resource".
    own: Mutex<BTreeMap<String, f64>>,
    reports: AtomicU64,
}

impl Log {
    fn push(&self, job: &str, seen: Seen) {
        let mut events = self.events.lock().expect("events");
        events.entry(job.to_owned()).or_default().push((Instant::now(), seen));
    }

    fn own_call(&self, key: &str) {
        *self.own.lock().expect("own").entry(key.to_owned()).or_insert(0.0) += 1.0;
    }

    fn first_after(&self, job: &str, since: Instant, wanted: impl Fn(&Seen) -> bool) -> Option<Instant> {
        let events = self.events.lock().expect("events");
        events.get(job)?.iter().find(|(at, seen)| *at >= since && wanted(seen)).map(|(at, _)| *at)
    }

    fn state(&self, job: &str) -> Option<(String, String, u64)> {
        self.last.lock().expect("last").get(job).cloned()
    }
}

/// Follows the jobs' status (a watch), noting each stage/phase move and each deployed round.
async fn follow_jobs(api: Api<LifelongLearningJob>, log: Arc<Log>) {
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(event) = stream.next().await {
        let job = match event {
            Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) => job,
            _ => continue,
        };
        let value = serde_json::to_value(&job).expect("json");
        let name = value["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let status = &value["status"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let now = (text(&status["stage"]), text(&status["phase"]), status["deployed"]["round"].as_u64().unwrap_or(0));
        let before = log.last.lock().expect("last").insert(name.clone(), now.clone());
        let (stage, phase, deployed) = now;
        if before.as_ref().map(|(s, p, _)| (s, p)) != Some((&stage, &phase)) {
            log.push(&name, Seen::Status(stage, phase));
        }
        if before.map(|(_, _, d)| d) != Some(deployed) {
            log.push(&name, Seen::Deployed(deployed));
        }
    }
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// No kubelet, no scheduler: the bench runs each new pod of the jobs (a watch), with instant
/// workers; a pod being deleted is removed at once.
async fn kubelet(pods: Api<Pod>, namespace: String, edges: Arc<HashMap<String, u16>>, log: Arc<Log>) {
    let mut handled = HashSet::new();
    let owned = watcher::Config::default().labels("lifelonglearningjob.sedna.io/uid");
    let mut stream = watcher(pods.clone(), owned).boxed();
    let http = reqwest::Client::new();
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            _ => continue,
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            if handled.insert(format!("deleted/{name}")) {
                let (pods, log) = (pods.clone(), log.clone());
                tokio::spawn(async move {
                    log.own_call("DELETE pods");
                    let _ =
                        pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
                });
            }
            continue;
        }
        if !handled.insert(pod.metadata.uid.clone().unwrap_or_default()) {
            continue;
        }
        let job = label(&pod, "lifelonglearningjob.sedna.io/name").unwrap_or_default().to_owned();
        let kind = match label(&pod, "lifelonglearningjob.sedna.io/worker-type") {
            Some("train") => "train",
            Some("eval") => "eval",
            _ => "inference",
        };
        log.push(&job, Seen::Pod(kind));
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let Some(port) = edges.get(&node).copied() else { continue };
        let (pods, namespace, log, http) = (pods.clone(), namespace.clone(), log.clone(), http.clone());
        tokio::spawn(async move { run_worker(&pods, &namespace, &pod, kind, port, &job, &log, &http).await });
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_worker(
    pods: &Api<Pod>,
    namespace: &str,
    pod: &Pod,
    kind: &'static str,
    port: u16,
    job: &str,
    log: &Log,
    http: &reqwest::Client,
) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    log.own_call("PATCH pods/status");
    let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::running())).await;
    if kind == "inference" {
        log.push(job, Seen::InferReady);
        return;
    }
    let body = sedna_worker::report(pod, namespace, kind);
    // LC_SERVER is localhost:9100 on a node; here each node's agent has its own port.
    let worker = body["name"].as_str().unwrap_or_default().to_owned();
    let url = format!("http://127.0.0.1:{port}/sedna/workers/{worker}/info");
    for _ in 0..300 {
        match http.post(&url).json(&body).timeout(Duration::from_secs(5)).send().await {
            Ok(response) if response.status().is_success() => {
                log.reports.fetch_add(1, Ordering::Relaxed);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    log.own_call("PATCH pods/status");
    let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::succeeded())).await;
    log.push(job, if kind == "train" { Seen::TrainDone } else { Seen::EvalDone });
}

// ---------------------------------------------------------------- one scenario

struct BenchJob {
    name: String,
    index: PathBuf,
    lines: usize,
}

/// One job-round's times, from the samples appended.
#[derive(Default)]
struct RoundTimes {
    total: Duration,
    hops: [Duration; 5],
    worker: Duration,
}

const HOPS: [&str; 5] = [
    "samples appended -> Train Ready in status",
    "Train Ready -> train pod created",
    "train Succeeded -> eval pod created",
    "eval Succeeded -> inference pod created",
    "inference Ready -> status.deployed.round",
];

struct Outcome {
    label: String,
    jobs: usize,
    edges: usize,
    rounds_wanted: usize,
    rounds: Vec<RoundTimes>,
    rss_idle: f64,
    rss_after: f64,
    /// The largest RSS sampled after each round.
    rss_max: f64,
    /// What the compiles for the nodes did, in the compiling scenario.
    compiles: Option<String>,
    requests: BTreeMap<String, f64>,
    own: BTreeMap<String, f64>,
    /// The operator's own requests, as it counts them.
    operator_requests: BTreeMap<String, f64>,
    /// CPU seconds over the rounds: kube-apiserver and etcd (if found), the operator.
    control_plane_cpu: Option<(f64, f64)>,
    operator_cpu: f64,
    /// Load averages (1, 5, 15 min) before and after the rounds.
    load: (String, String),
    elapsed: Duration,
}

fn train_waiting(state: &Option<(String, String, u64)>) -> bool {
    state.as_ref().is_some_and(|(s, p, _)| s == "Train" && p == "Waiting")
}

/// A Python trigger on a real S3 server, and the key the operator signs its compiles with.
struct CompileLoad {
    s3: s3::S3Server,
    plugin: String,
    sha256: String,
    dir: tempfile::TempDir,
}

impl CompileLoad {
    async fn new() -> CompileLoad {
        let dir = tempfile::tempdir().expect("tempdir");
        let perennial = Path::new(env!("CARGO_BIN_EXE_perennial"));
        let project = plugin_projects::new_project(perennial, dir.path(), "trigger", "python", "py-trigger");
        let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-authors");
        let component = plugin_projects::build("python", "trigger", &project, "py-trigger", &target);
        let bytes = std::fs::read(&component).expect("the Python component");
        let sha256: String = {
            use sha2::Digest as _;
            sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
        };
        let s3 = s3::S3Server::start().await;
        s3.put("policies", "py_trigger.wasm", &bytes);
        let key = dir.path().join("operator");
        plugin_projects::run_in(dir.path(), perennial.to_str().expect("path"), &["plugin", "keygen", "operator"], &[]);
        assert!(key.with_extension("key").is_file(), "keygen wrote no key");
        eprintln!("   the Python trigger: {:.1} MB, sha256 {sha256}", bytes.len() as f64 / 1e6);
        CompileLoad { s3, plugin: "s3://policies/py_trigger.wasm".into(), sha256, dir }
    }
}

async fn scenario(
    cluster: &Cluster,
    label: &str,
    edges: usize,
    per_node: usize,
    rounds: usize,
    compiling: Option<&CompileLoad>,
) -> Outcome {
    eprintln!("== {label}: {} jobs on {edges} edges, {rounds} rounds", edges * per_node);
    let namespace = cluster.namespace("bench").await;
    let root = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| root.path().join(name).display().to_string();
    let pki = link_support::pki();
    for (file, pem) in [("ca.pem", &pki.ca_pem), ("link.crt", &pki.cert_pem), ("link.key", &pki.key_pem)] {
        std::fs::write(root.path().join(file), pem).expect("pem");
    }
    let nodes: Vec<String> = (0..edges).map(|n| format!("node-{n}-{namespace}")).collect();
    // The compiling scenario's two nodes of a Python job: this machine's platform, and Pulley.
    let python_nodes: Vec<String> = match compiling {
        Some(_) => vec![format!("py-native-{namespace}"), format!("py-pulley-{namespace}")],
        None => Vec::new(),
    };
    let tokens: serde_json::Map<String, Value> = nodes
        .iter()
        .chain(&python_nodes)
        .map(|node| (node.clone(), json!(format!("token-of-{node}-for-the-bench"))))
        .collect();
    for node in nodes.iter().chain(&python_nodes) {
        std::fs::write(root.path().join(format!("token-{node}")), tokens[node].as_str().expect("token"))
            .expect("token");
    }
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "edge-tokens"}, "stringData": tokens})).expect("secret");
    Api::<Secret>::namespaced(cluster.client.clone(), &namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the tokens' Secret");
    // The cluster-wide install reads Secrets only where this is bound (README).
    let account = "--serviceaccount=perennial-system:perennial-operator";
    let role = "--clusterrole=perennial-operator-credentials";
    cluster.kubectl(&["-n", &namespace, "create", "rolebinding", "perennial-operator-credentials", role, account]);
    let operator_kubeconfig = service_account::service_account_kubeconfig(
        &cluster.client,
        (&cluster.server, &cluster.ca_pem),
        "perennial-system",
        "perennial-operator",
        root.path(),
    )
    .await;
    let edge_ports: Vec<u16> = nodes.iter().map(|_| free_port()).collect();

    // The operator, as deployed (leader election on its own Lease), scoped to this namespace.
    let (metrics_port, link_port) = (free_port(), free_port());
    let args: Vec<String> = [
        "operator",
        "--kubeconfig",
        &operator_kubeconfig.display().to_string(),
        "--namespace",
        &namespace,
        "--metrics-addr",
        &format!("127.0.0.1:{metrics_port}"),
        "--lc-server",
        &format!("http://127.0.0.1:{}", edge_ports[0]),
        "--lease-namespace",
        "perennial-system",
        "--lease-name",
        &format!("operator-{namespace}"),
        "--identity",
        "bench",
        "--link-addr",
        &format!("127.0.0.1:{link_port}"),
        "--link-cert",
        &path("link.crt"),
        "--link-key",
        &path("link.key"),
        "--link-tokens",
        &format!("{namespace}/edge-tokens"),
    ]
    .map(str::to_owned)
    .to_vec();
    let mut args = args;
    let mut env = Vec::new();
    if let Some(load) = compiling {
        let key = load.dir.path().join("operator.key").display().to_string();
        args.extend(["--sign-key".into(), key, "--artifact-dir".into(), path("artifacts")]);
        // The compile's child fetches the Python component from S3 with these.
        env = load.s3.credentials().worker_env();
    }
    let operator = Process::start_with(&args, root.path().join("operator.log"), &env);
    let http = reqwest::Client::new();
    let ready = format!("http://127.0.0.1:{metrics_port}/leaderz");
    wait("the operator's /leaderz", Duration::from_secs(60), &[&operator], || async {
        let response = http.get(&ready).timeout(Duration::from_secs(2)).send().await.ok()?;
        response.status().is_success().then_some(())
    })
    .await;

    // The edges, with their default flags.
    let edge_args = |port: u16, node: &str, state: &str| -> Vec<String> {
        [
            "edge",
            "--bind-address",
            "127.0.0.1",
            "--bind-port",
            &port.to_string(),
            "--cloud-url",
            &format!("wss://localhost:{link_port}/v1/link"),
            "--token-file",
            &path(&format!("token-{node}")),
            "--ca-file",
            &path("ca.pem"),
            "--node-name",
            node,
            "--state-dir",
            &path(state),
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let mut edge_processes = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        let args = edge_args(edge_ports[n], node, &format!("edge-{n}"));
        edge_processes.push(Process::start(&args, root.path().join(format!("edge-{n}.log"))));
    }
    if let Some(load) = compiling {
        let public = load.dir.path().join("operator.pub").display().to_string();
        for (n, node) in python_nodes.iter().enumerate() {
            let mut args = edge_args(free_port(), node, &format!("py-edge-{n}"));
            args.extend(["--trust-key".to_owned(), public.clone()]);
            let pulley = [("PERENNIAL_POLICY_PLATFORM".to_owned(), "pulley64".to_owned())];
            let env = if n == 1 { &pulley[..] } else { &[] };
            // The Python job's nodes stand for boards of their own: what they do with the policy
            // (a debug build loads a 30 MB one in Pulley for seconds) is not the operator's cost.
            edge_processes.push(Process::start_elsewhere(&args, root.path().join(format!("py-edge-{n}.log")), env));
        }
    }
    let log = Arc::new(Log::default());
    let by_node: Arc<HashMap<String, u16>> = Arc::new(nodes.iter().cloned().zip(edge_ports.iter().copied()).collect());
    let jobs_api: Api<LifelongLearningJob> = Api::namespaced(cluster.client.clone(), &namespace);
    let pods_api: Api<Pod> = Api::namespaced(cluster.client.clone(), &namespace);
    let follow = tokio::spawn(follow_jobs(jobs_api, log.clone()));
    let playing = tokio::spawn(kubelet(pods_api, namespace.clone(), by_node, log.clone()));

    // Each job its own Dataset and index folder on its node; one `kubectl apply` of them all.
    let mut jobs = Vec::new();
    let mut items = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for j in 0..per_node {
            let name = format!("job-{n}-{j}");
            let index = root.path().join(format!("data-{n}/{name}/index.txt"));
            std::fs::create_dir_all(index.parent().expect("parent")).expect("data dir");
            std::fs::write(&index, "").expect("index");
            let template = |kind: &str| {
                json!({"spec": {"nodeName": node, "containers": [
                    {"name": kind, "image": "kubeedge/sedna-example-lifelong-learning-atcii-classifier:v0.5.0",
                     "args": [format!("{kind}.py")], "env": [{"name": "metric_name", "value": "mlogloss"}]}]}})
            };
            items.push(json!({"apiVersion": "sedna.io/v1alpha1", "kind": "Dataset",
                "metadata": {"name": format!("{name}-data")},
                "spec": {"url": index, "format": "txt", "nodeName": node}}));
            // Sedna's sample: checkPeriodSeconds 60; the change notification has to do it.
            items.push(json!({"apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob",
                "metadata": {"name": name},
                "spec": {
                    "dataset": {"name": format!("{name}-data"), "trainProb": 0.8},
                    "trainSpec": {"template": template("train"), "trigger": {
                        "checkPeriodSeconds": 60,
                        "condition": {"operator": ">=", "threshold": THRESHOLD, "metric": "num_of_samples"}}},
                    "evalSpec": {"template": template("eval")},
                    "deploySpec": {"template": template("infer")},
                    "outputDir": root.path().join(format!("out-{n}/{name}"))}}));
            jobs.push(BenchJob { name, index, lines: 0 });
        }
    }
    let manifest = root.path().join("jobs.json");
    std::fs::write(
        &manifest,
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "List", "items": items})).expect("json"),
    )
    .expect("manifest");
    cluster.kubectl(&["apply", "-n", &namespace, "-f", &manifest.display().to_string()]);

    // Every edge holds its jobs; every job waits for its first Train.
    let all: Vec<&Process> = std::iter::once(&operator).chain(&edge_processes).collect();
    wait("every edge to hold its jobs", Duration::from_secs(120), &all, || async {
        let held: usize = (0..edges).filter_map(|n| edge_jobs(&root.path().join(format!("edge-{n}/edge.db")))).sum();
        (held == jobs.len()).then_some(())
    })
    .await;
    wait("every job in Train Waiting", Duration::from_secs(120), &all, || async {
        jobs.iter().all(|job| train_waiting(&log.state(&job.name))).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_idle = operator.rss_mib();
    eprintln!("   operator idle: {rss_idle:.1} MiB (anon {:.1})", operator.rss_anon_mib());

    let load_before = load_average();
    let before = cluster.requests().await;
    let own_before = log.own.lock().expect("own").clone();
    let operator_before = operator_requests(&http, metrics_port).await;
    let cpu_before = (cluster.control_plane_cpu(), operator.cpu_seconds());
    // The Python jobs come now: the operator compiles their trigger for both platforms while the
    // rounds run.
    let compiles_started = Instant::now();
    if let Some(load) = compiling {
        let mut items = Vec::new();
        for (n, node) in python_nodes.iter().enumerate() {
            let name = format!("py-job-{n}");
            let index = root.path().join(format!("py-data-{n}/index.txt"));
            std::fs::create_dir_all(index.parent().expect("parent")).expect("data dir");
            std::fs::write(&index, "").expect("index");
            let template = |kind: &str| json!({"spec": {"nodeName": node, "containers": [{"name": kind, "image": "example/worker:1"}]}});
            items.push(json!({"apiVersion": "sedna.io/v1alpha1", "kind": "Dataset",
                "metadata": {"name": format!("{name}-data")},
                "spec": {"url": index, "format": "txt", "nodeName": node}}));
            items.push(json!({"apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob",
                "metadata": {"name": name},
                "spec": {
                    "dataset": {"name": format!("{name}-data"), "trainProb": 0.8},
                    "trainSpec": {"template": template("train"), "trigger": {"policy": {
                        "plugin": load.plugin, "sha256": load.sha256, "config": {"samples": 3},
                        "limits": {"startTimeoutMs": 20000}}}},
                    "evalSpec": {"template": template("eval")},
                    "deploySpec": {"template": template("infer")},
                    "outputDir": root.path().join(format!("py-out-{n}"))}}));
        }
        let manifest = root.path().join("python-jobs.json");
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        std::fs::write(&manifest, serde_json::to_vec(&list).expect("json")).expect("manifest");
        cluster.kubectl(&["apply", "-n", &namespace, "-f", &manifest.display().to_string()]);
    }
    let python_artifacts = || {
        std::fs::read_dir(root.path().join("artifacts"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "pcwasm"))
            .filter(|entry| compiling.is_some_and(|load| entry.file_name().to_string_lossy().starts_with(&load.sha256)))
            .count()
    };
    let mut compiled_after = None;
    let mut rss_max = operator.rss_mib();
    let started = Instant::now();
    let mut times = Vec::new();
    let per_round_limit = Duration::from_secs(if jobs.len() > 1 { 300 } else { 120 });
    // While compiling: rounds go on until the compiles are done (a round at least after them),
    // which give way to the control plane: with rounds back to back, a tenth of a core or so.
    let mut round = 0;
    while round < rounds || compiling.is_some() && compiled_after.is_none() && started.elapsed() < COMPILES_WAITED {
        round += 1;
        let mut appended = Vec::new();
        for job in &mut jobs {
            let deployed = log.state(&job.name).map_or(0, |(_, _, d)| d);
            let at = Instant::now();
            append(&job.index, job.lines, SAMPLES);
            job.lines += SAMPLES;
            appended.push((at, deployed));
        }
        wait(&format!("round {round} deployed on every job"), per_round_limit, &all, || async {
            jobs.iter()
                .zip(&appended)
                .all(|(job, (at, deployed))| {
                    log.first_after(&job.name, *at, |s| matches!(s, Seen::Deployed(d) if d > deployed)).is_some()
                })
                .then_some(())
        })
        .await;
        for (job, (at, deployed)) in jobs.iter().zip(&appended) {
            times.push(round_times(&log, &job.name, *at, *deployed));
        }
        // The next round starts from Train Waiting, as a user's would.
        wait(&format!("round {round} complete on every job"), per_round_limit, &all, || async {
            jobs.iter().all(|job| train_waiting(&log.state(&job.name))).then_some(())
        })
        .await;
        let last: Vec<f64> = times[times.len() - jobs.len()..].iter().map(|t| ms(t.total)).collect();
        let rss = operator.rss_mib();
        let compiled =
            if compiling.is_some() { format!(", {} of 2 compiled", python_artifacts()) } else { String::new() };
        eprintln!(
            "   round {round}: p50 {:.0} ms, max {:.0} ms, operator RSS {rss:.1} MiB (anon {:.1}){compiled}",
            pct(&last, 50.0),
            pct(&last, 100.0),
            operator.rss_anon_mib()
        );
        rss_max = rss_max.max(rss);
        if compiled_after.is_none() && compiling.is_some() && python_artifacts() == 2 {
            compiled_after = Some((compiles_started.elapsed(), round));
        }
    }
    let elapsed = started.elapsed();
    // The operator publishes Events off the reconcile path: its calls are counted once they stop.
    let mut settled = operator_requests(&http, metrics_port).await;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = operator_requests(&http, metrics_port).await;
        let quiet = now.iter().all(|(key, count)| {
            key.starts_with("get leases") || key.starts_with("update leases") || settled.get(key) == Some(count)
        });
        settled = now;
        if quiet {
            break;
        }
    }
    let after = cluster.requests().await;
    let own_after = log.own.lock().expect("own").clone();
    let operator_after = operator_requests(&http, metrics_port).await;
    let cpu_after = (cluster.control_plane_cpu(), operator.cpu_seconds());
    let control_plane_cpu = match (cpu_before.0, cpu_after.0) {
        (Some((api, etcd)), Some((api_after, etcd_after))) => Some((api_after - api, etcd_after - etcd)),
        _ => None,
    };
    let rss_after = operator.rss_mib();
    let fetched = || {
        (0..python_nodes.len())
            .filter(|n| {
                std::fs::read_dir(root.path().join(format!("py-edge-{n}/artifacts")))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|entry| {
                        entry.path().extension().is_some_and(|ext| ext == "bin")
                            && entry.metadata().is_ok_and(|meta| meta.len() > 1_000_000)
                    })
            })
            .count()
    };
    // The nodes fetch what was compiled (a minute at most).
    for _ in 0..600 {
        if compiling.is_none() || compiled_after.is_none() || fetched() == python_nodes.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let compiles = compiling.map(|_| {
        let fetched = fetched();
        match compiled_after {
            Some((after, round)) => format!(
                "the Python trigger compiled for both platforms {:.1} s after its jobs came (by round {round}); \
                 {fetched} of 2 nodes fetched it; the operator's RSS then {:.1} MiB (anon {:.1})",
                after.as_secs_f64(),
                operator.rss_mib(),
                operator.rss_anon_mib()
            ),
            None => format!(
                "the Python trigger was not compiled for both platforms during the rounds ({} of 2)",
                python_artifacts()
            ),
        }
    });
    let diff = measure::grown;
    follow.abort();
    playing.abort();
    drop(edge_processes);
    drop(operator);
    Outcome {
        label: label.to_owned(),
        jobs: jobs.len(),
        edges,
        rounds_wanted: rounds,
        rounds: times,
        rss_idle,
        rss_after,
        rss_max,
        compiles,
        requests: diff(&after, &before),
        own: diff(&own_after, &own_before),
        operator_requests: diff(&operator_after, &operator_before),
        control_plane_cpu,
        operator_cpu: cpu_after.1 - cpu_before.1,
        load: (load_before, load_average()),
        elapsed,
    }
}

fn append(index: &Path, from: usize, count: usize) {
    let mut file = std::fs::OpenOptions::new().append(true).open(index).expect("index");
    let text: String = (from..from + count).map(|n| format!("images/{n}.png {}\n", n % 3)).collect();
    file.write_all(text.as_bytes()).expect("append");
}

fn edge_jobs(db: &Path) -> Option<usize> {
    let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
    conn.busy_timeout(Duration::from_secs(2)).ok()?;
    conn.query_row("SELECT COUNT(*) FROM jobs", [], |row| row.get::<_, i64>(0)).ok().map(|n| n as usize)
}

fn round_times(log: &Log, job: &str, at: Instant, deployed: u64) -> RoundTimes {
    let find = |from: Instant, wanted: &dyn Fn(&Seen) -> bool| log.first_after(job, from, wanted).unwrap_or(from);
    let ready = find(at, &|s| matches!(s, Seen::Status(stage, phase) if !(stage == "Train" && phase == "Waiting")));
    let train_pod = find(at, &|s| *s == Seen::Pod("train"));
    let train_done = find(train_pod, &|s| *s == Seen::TrainDone);
    let eval_pod = find(train_done, &|s| *s == Seen::Pod("eval"));
    let eval_done = find(eval_pod, &|s| *s == Seen::EvalDone);
    let infer_pod = find(eval_done, &|s| *s == Seen::Pod("inference"));
    let infer_ready = find(infer_pod, &|s| *s == Seen::InferReady);
    let done = find(at, &|s| matches!(s, Seen::Deployed(d) if *d > deployed));
    let span = |a: Instant, b: Instant| b.saturating_duration_since(a);
    RoundTimes {
        total: span(at, done),
        hops: [
            span(at, ready),
            span(ready, train_pod),
            span(train_done, eval_pod),
            span(eval_done, infer_pod),
            span(infer_ready, done),
        ],
        worker: span(train_pod, train_done) + span(eval_pod, eval_done) + span(infer_pod, infer_ready),
    }
}

/// Waits until `done` answers `Some`, every 20 ms; after `limit`, panics with the processes' logs.
async fn wait<T, F, Fut>(what: &str, limit: Duration, processes: &[&Process], mut done: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = done().await {
            return value;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = processes.iter().map(|p| p.tail()).collect();
            panic!("timed out after {limit:?} waiting for {what}\n{}", logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------- the table

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p`th percentile (nearest rank) of `values`.
fn pct(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn print_results(results: &[Outcome]) {
    println!();
    println!("perennial cluster bench: the operator and linked edges on a real kube-apiserver, instant workers");
    for outcome in results {
        let done = outcome.rounds.len();
        println!();
        println!(
            "== {}: {} job(s), {} edge(s), {} round(s) each, {} job-rounds in {:.1} s",
            outcome.label,
            outcome.jobs,
            outcome.edges,
            outcome.rounds_wanted,
            done,
            outcome.elapsed.as_secs_f64()
        );
        println!("{:<48} {:>9} {:>9} {:>9}", "ms", "p50", "p90", "max");
        let row = |name: &str, values: Vec<f64>| {
            println!("{name:<48} {:>9.1} {:>9.1} {:>9.1}", pct(&values, 50.0), pct(&values, 90.0), pct(&values, 100.0));
        };
        row("round: samples appended -> round deployed", outcome.rounds.iter().map(|t| ms(t.total)).collect());
        row("  of which the bench's kubelet + workers", outcome.rounds.iter().map(|t| ms(t.worker)).collect());
        row(
            "  control plane alone (round - workers)",
            outcome.rounds.iter().map(|t| ms(t.total.saturating_sub(t.worker))).collect(),
        );
        for (i, hop) in HOPS.iter().enumerate() {
            row(hop, outcome.rounds.iter().map(|t| ms(t.hops[i])).collect());
        }
        println!("{:<48} {:>9.1} MiB", "operator RSS idle (jobs applied)", outcome.rss_idle);
        println!("{:<48} {:>9.1} MiB", "operator RSS after the rounds", outcome.rss_after);
        println!("{:<48} {:>9.1} MiB", "operator RSS, largest after a round", outcome.rss_max);
        if let Some(compiles) = &outcome.compiles {
            println!("{compiles}");
        }
        let per = done.max(1) as f64;
        let total: f64 = outcome.requests.values().sum();
        let own: f64 = outcome.own.values().sum();
        println!(
            "API requests per job-round: {:.1} in all; {:.1} the bench's kubelet; {:.1} the rest (operator, watches)",
            total / per,
            own / per,
            (total - own) / per
        );
        for (key, count) in &outcome.requests {
            let mine = outcome.own.get(key).copied().unwrap_or(0.0);
            let rest = count - mine;
            if rest / per >= 0.05 {
                println!("    {key:<44} {:>9.2}", rest / per);
            }
        }
        let operator: f64 = outcome.operator_requests.values().sum();
        println!("the operator's own requests per job-round (its /metrics): {:.1}", operator / per);
        for (key, count) in &outcome.operator_requests {
            println!("    {key:<44} {:>9.2}", count / per);
        }
        match outcome.control_plane_cpu {
            Some((api, etcd)) => println!(
                "CPU per job-round: kube-apiserver {:.1} ms, etcd {:.1} ms, the operator {:.1} ms",
                api * 1000.0 / per,
                etcd * 1000.0 / per,
                outcome.operator_cpu * 1000.0 / per
            ),
            None => println!(
                "CPU per job-round: the operator {:.1} ms (no kube-apiserver.pid / etcd.pid: set PERENNIAL_BENCH_K8S_STATE)",
                outcome.operator_cpu * 1000.0 / per
            ),
        }
        println!("load average before / after the rounds: {} / {}", outcome.load.0, outcome.load.1);
    }
}
