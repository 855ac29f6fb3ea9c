//! One job's world on the real API server: a namespace, the operator run as its ServiceAccount
//! (the RBAC of `deploy/operator`), a linked `perennial edge`, and the test playing the kubelet
//! and the workers (Sedna's report API), checking every pod against Sedna's contract.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use perennial_api::{Dataset, LifelongLearningJob};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::harness::{Cluster, Process, cluster, free_port};
use crate::link_support::pki;
use crate::sedna_worker;

pub const JOB: &str = "thermal";
pub const DATASET: &str = "readings";
const TOKEN: &str = "a-node-token-for-the-tests";
/// The operator's ServiceAccount (deploy/operator), as the API server names it.
const OPERATOR_ACCOUNT: &str = "system:serviceaccount:perennial-system:perennial-operator";

/// The files, names and ports of one world.
pub struct World {
    pub cluster: &'static Cluster,
    pub client: kube::Client,
    pub namespace: String,
    pub node: String,
    pub root: tempfile::TempDir,
    pub index: PathBuf,
    pub output: PathBuf,
    pub edge_port: u16,
    /// A kubeconfig of the operator's ServiceAccount (deploy/operator's RBAC).
    pub operator_kubeconfig: PathBuf,
    lines: Mutex<usize>,
    /// How many operator processes were started (each logs to a file of its own).
    operator_logs: std::sync::atomic::AtomicUsize,
    edge_logs: std::sync::atomic::AtomicUsize,
}

/// One `perennial operator` replica.
pub struct Operator {
    pub process: Process,
    pub metrics_port: u16,
    pub link_port: u16,
}

impl World {
    pub async fn new(prefix: &str) -> World {
        let cluster = cluster();
        cluster.install();
        let client = cluster.client().await;
        let namespace = cluster.namespace(&client, prefix).await;
        let root = tempfile::tempdir().expect("tempdir");
        let pki = pki();
        for (file, pem) in [("ca.pem", &pki.ca_pem), ("link.crt", &pki.cert_pem), ("link.key", &pki.key_pem)] {
            std::fs::write(root.path().join(file), pem).expect("pem");
        }
        std::fs::write(root.path().join("token"), TOKEN).expect("token");
        let node = format!("node-{namespace}");
        cluster.secret(&client, &namespace, "edge-tokens", &[(&node, TOKEN)]).await;
        // The link's node tokens are a Secret of this namespace: the operator of the cluster-wide
        // install reads Secrets only where it is granted so (README's command).
        cluster.kubectl_ok(&[
            "-n",
            &namespace,
            "create",
            "rolebinding",
            "perennial-operator-credentials",
            "--clusterrole=perennial-operator-credentials",
            "--serviceaccount=perennial-system:perennial-operator",
        ]);
        // Bound once the API server's authorizer says so (its cache follows the binding).
        let can_i = ["auth", "can-i", "get", "secrets", "-n", &namespace, "--as", OPERATOR_ACCOUNT];
        for _ in 0..100 {
            if cluster.kubectl(&can_i).stdout.starts_with(b"yes") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let operator_kubeconfig =
            cluster.service_account_kubeconfig(&client, "perennial-system", "perennial-operator", root.path()).await;
        let index = root.path().join("data/index.txt");
        std::fs::create_dir_all(index.parent().expect("parent")).expect("data dir");
        std::fs::write(&index, "").expect("index");
        let output = root.path().join("output");
        World {
            cluster,
            client,
            namespace,
            node,
            index,
            output,
            edge_port: free_port(),
            operator_kubeconfig,
            lines: Mutex::new(0),
            operator_logs: Default::default(),
            edge_logs: Default::default(),
            root,
        }
    }

    /// A file in this world's folder.
    pub fn file(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// A replica of `perennial operator`, as its ServiceAccount, scoped to this namespace,
    /// competing for this world's Lease.
    pub fn start_operator(&self, identity: &str) -> Operator {
        self.start_operator_at(identity, free_port(), free_port())
    }

    /// [`World::start_operator`] on given ports (a replica restarted where it was).
    pub fn start_operator_at(&self, identity: &str, metrics_port: u16, link_port: u16) -> Operator {
        self.start_operator_with(identity, (metrics_port, link_port), &[])
    }

    /// [`World::start_operator_at`] with some flags given other values (`("--namespace", "a,b")`).
    pub fn start_operator_with(&self, identity: &str, ports: (u16, u16), overrides: &[(&str, &str)]) -> Operator {
        self.start_operator_env(identity, ports, overrides, &[])
    }

    /// [`World::start_operator_with`] with some environment (`RUST_LOG` given replaces the
    /// default one).
    pub fn start_operator_env(
        &self,
        identity: &str,
        ports: (u16, u16),
        overrides: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Operator {
        let (metrics_port, link_port) = ports;
        let file = |name: &str| self.file(name).display().to_string();
        let mut args: Vec<String> = [
            "operator",
            "--kubeconfig",
            &self.operator_kubeconfig.display().to_string(),
            "--namespace",
            &self.namespace,
            "--metrics-addr",
            &format!("127.0.0.1:{metrics_port}"),
            "--lc-server",
            &format!("http://127.0.0.1:{}", self.edge_port),
            "--lease-namespace",
            "perennial-system",
            "--lease-name",
            &format!("operator-{}", self.namespace),
            "--identity",
            identity,
            "--link-addr",
            &format!("127.0.0.1:{link_port}"),
            "--link-cert",
            &file("link.crt"),
            "--link-key",
            &file("link.key"),
            "--link-tokens",
            &format!("{}/edge-tokens", self.namespace),
            "--link-heartbeat-secs",
            "1",
        ]
        .map(str::to_owned)
        .to_vec();
        for (flag, value) in overrides {
            match args.iter().position(|arg| arg == flag) {
                Some(at) => args[at + 1] = (*value).to_owned(),
                None => args.extend([(*flag).to_owned(), (*value).to_owned()]),
            }
        }
        let log = self.file(&format!("operator-{identity}-{}.log", self.operator_logs.fetch_add(1, Ordering::SeqCst)));
        let mut env = env.to_vec();
        if !env.iter().any(|(name, _)| *name == "RUST_LOG") {
            env.push(("RUST_LOG", "info,perennial=debug"));
        }
        let process = Process::start(&args, log, &env);
        Operator { process, metrics_port, link_port }
    }

    /// `perennial edge` for this world's node, linked to `link_port`.
    pub fn start_edge(&self, link_port: u16) -> Process {
        self.start_edge_with(link_port, &[], &[])
    }

    /// [`World::start_edge`] with more flags and environment (its log: `edge-N.log`).
    pub fn start_edge_with(&self, link_port: u16, more: &[&str], env: &[(&str, &str)]) -> Process {
        let file = |name: &str| self.file(name).display().to_string();
        let mut args: Vec<String> = [
            "edge",
            "--bind-address",
            "127.0.0.1",
            "--bind-port",
            &self.edge_port.to_string(),
            "--poll-ms",
            "50",
            "--cloud-url",
            &format!("wss://localhost:{link_port}/v1/link"),
            "--token-file",
            &file("token"),
            "--ca-file",
            &file("ca.pem"),
            "--node-name",
            &self.node,
            "--state-dir",
            &file("edge-state"),
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(more.iter().map(|arg| (*arg).to_owned()));
        let mut env = env.to_vec();
        if !env.iter().any(|(name, _)| *name == "RUST_LOG") {
            env.push(("RUST_LOG", "info,perennial=debug"));
        }
        let log = match self.edge_logs.fetch_add(1, Ordering::SeqCst) {
            0 => self.file("edge.log"),
            n => self.file(&format!("edge-{n}.log")),
        };
        Process::start(&args, log, &env)
    }

    /// The Dataset (on this world's node) and the job, applied with kubectl as a user would:
    /// the thermal-comfort shape of Sedna's sample, with a trigger at `threshold` samples.
    pub fn apply_job(&self, threshold: u32) {
        self.apply_job_with_trigger(threshold, None);
    }

    /// [`World::apply_job`] with `policy` as the trigger's policy reference.
    pub fn apply_job_with_trigger(&self, threshold: u32, policy: Option<serde_json::Value>) {
        self.apply_job_pulling(threshold, policy, &[]);
    }

    /// [`World::apply_job_with_trigger`] with `pull_secrets` as the `imagePullSecrets` of the
    /// train template (and the first of them the inference template's too).
    pub fn apply_job_pulling(&self, threshold: u32, policy: Option<serde_json::Value>, pull_secrets: &[&str]) {
        let template = |name: &str| {
            let mut template = json!({"spec": {"nodeName": self.node, "containers": [
                {"name": name, "image": "kubeedge/sedna-example-lifelong-learning-atcii-classifier:v0.5.0",
                 "args": [format!("{name}.py")], "env": [{"name": "metric_name", "value": "mlogloss"}]}]}});
            let named: Vec<&str> = match name {
                "train" => pull_secrets.to_vec(),
                "infer" => pull_secrets.iter().take(1).copied().collect(),
                _ => vec![],
            };
            if !named.is_empty() {
                let names: Vec<Value> = named.iter().map(|name| json!({"name": name})).collect();
                template["spec"]["imagePullSecrets"] = Value::Array(names);
            }
            template
        };
        let manifests = [
            json!({"apiVersion": "sedna.io/v1alpha1", "kind": "Dataset", "metadata": {"name": DATASET},
                   "spec": {"url": self.index, "format": "txt", "nodeName": self.node}}),
            json!({"apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob", "metadata": {"name": JOB},
                   "spec": {
                       "dataset": {"name": DATASET, "trainProb": 0.8},
                       "trainSpec": {"template": template("train"), "trigger": {
                           "checkPeriodSeconds": 1,
                           "condition": {"operator": ">=", "threshold": threshold, "metric": "num_of_samples"}}},
                       "evalSpec": {"template": template("eval")},
                       "deploySpec": {"template": template("infer")},
                       "outputDir": self.output}}),
        ];
        let mut manifests = manifests;
        if let Some(policy) = policy {
            manifests[1]["spec"]["trainSpec"]["trigger"]["policy"] = policy;
        }
        for manifest in manifests {
            let file = tempfile::NamedTempFile::new().expect("temp");
            std::fs::write(file.path(), serde_json::to_vec(&manifest).expect("json")).expect("write");
            self.cluster.kubectl_ok(&["apply", "-n", &self.namespace, "-f", &file.path().display().to_string()]);
        }
    }

    /// Appends `count` samples to the dataset's index.
    pub fn append_samples(&self, count: usize) {
        let mut lines = self.lines.lock().expect("lines");
        let mut index = std::fs::OpenOptions::new().append(true).open(&self.index).expect("index");
        let mut text = String::new();
        for n in *lines..*lines + count {
            text.push_str(&format!("images/{n}.png {}\n", n % 3));
        }
        index.write_all(text.as_bytes()).expect("append");
        *lines += count;
    }

    pub fn samples(&self) -> usize {
        *self.lines.lock().expect("lines")
    }

    pub fn jobs(&self) -> Api<LifelongLearningJob> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn datasets(&self) -> Api<Dataset> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The job as JSON, if it exists.
    pub async fn job(&self) -> Option<Value> {
        let job = self.jobs().get_opt(JOB).await.ok()??;
        Some(serde_json::to_value(job).expect("json"))
    }

    /// Waits until round `round` is deployed and complete (the job then waits for the next
    /// round's Train); on a timeout, says where
    /// the job stands and what the operator and the edge logged last.
    pub async fn until_deployed(&self, round: u64, limit: Duration) -> Value {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let job = self.job().await;
            if let Some(job) = &job
                && job["status"]["deployed"]["round"].as_u64() >= Some(round)
                && job["status"]["roundsCompleted"].as_u64() >= Some(round)
            {
                return job.clone();
            }
            if std::time::Instant::now() > deadline {
                let status = job.map(|j| j["status"].clone()).unwrap_or_default();
                panic!("timed out after {limit:?} waiting for round {round} deployed: {status:#}\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of every log of this world (operators, edge).
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for entry in std::fs::read_dir(self.root.path()).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let log = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(100)..].join("\n");
                text.push_str(&format!("----- {} -----\n{tail}\n", path.display()));
            }
        }
        text
    }

    /// Plays the kubelet and the workers for this namespace until dropped.
    pub fn kubelet(&self) -> Kubelet {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::new(AtomicBool::new(false));
        let manual_train = Arc::new(AtomicBool::new(false));
        let slow_to_stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(kubelet(
            self.pods(),
            self.namespace.clone(),
            PathBuf::from("/"),
            seen.clone(),
            held.clone(),
            manual_train.clone(),
            slow_to_stop.clone(),
        ));
        Kubelet { task, seen, held, manual_train, slow_to_stop }
    }

    /// Every line of the operator's logs that says the API server forbade a call.
    pub fn forbidden_calls(operators: &[&Operator]) -> Vec<String> {
        operators
            .iter()
            .flat_map(|o| o.process.log_text().lines().map(str::to_owned).collect::<Vec<_>>())
            .filter(|line| line.to_lowercase().contains("forbidden"))
            .collect()
    }

    /// The edge's SQLite state, read.
    pub fn edge_query(&self, sql: &str) -> Option<i64> {
        let conn = rusqlite::Connection::open(self.file("edge-state/edge.db")).ok()?;
        conn.busy_timeout(Duration::from_secs(5)).ok()?;
        conn.query_row(sql, [], |row| row.get(0)).ok()
    }
}

/// Plays the kubelet and the workers for `namespace`, whose pods' node has its `/` at
/// `node_root` here, until dropped.
pub fn play_workers(pods: Api<Pod>, namespace: String, node_root: PathBuf) -> Kubelet {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (held, manual_train, slow_to_stop) = Default::default();
    let flags = (Arc::clone(&held), Arc::clone(&manual_train), Arc::clone(&slow_to_stop));
    let task = tokio::spawn(kubelet(pods, namespace, node_root, seen.clone(), flags.0, flags.1, flags.2));
    Kubelet { task, seen, held, manual_train, slow_to_stop }
}

/// The kubelet and workers the test plays, and the pods they saw.
pub struct Kubelet {
    task: JoinHandle<()>,
    pub seen: Arc<Mutex<Vec<Pod>>>,
    /// While set, workers start but hold their report.
    pub held: Arc<AtomicBool>,
    /// While set, train pods are seen but not run: the test plays their workers itself.
    pub manual_train: Arc<AtomicBool>,
    /// While set, pods being deleted stay Terminating (their containers slow to stop).
    pub slow_to_stop: Arc<AtomicBool>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kubelet {
    /// The pods seen of `worker_type` (train, eval, inference), in the order they came.
    pub fn pods(&self, worker_type: &str) -> Vec<Pod> {
        self.seen
            .lock()
            .expect("seen")
            .iter()
            .filter(|pod| label(pod, "lifelonglearningjob.sedna.io/worker-type") == Some(worker_type))
            .cloned()
            .collect()
    }
}

/// Waits (up to 10 s) until the pod's job is Running in the pod's stage.
async fn until_job_running(pods: &Api<Pod>, pod: &Pod, kind: &str) {
    let Some(owner) = pod.metadata.owner_references.iter().flatten().find(|o| o.kind == "LifelongLearningJob") else {
        return;
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let jobs: Api<LifelongLearningJob> = Api::namespaced(pods.clone().into_client(), &namespace);
    for _ in 0..200 {
        if let Ok(job) = jobs.get(&owner.name).await
            && let Some(status) = job.status
            && status.stage.is_some_and(|stage| stage.worker_kind() == kind)
            && status.phase == Some(perennial_api::Phase::Running)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// No kubelet, no scheduler: each new pod of the namespace is run by the test. Train and eval
/// workers report their result to the edge agent at `LC_SERVER` as Sedna's library does (retried,
/// as it retries), then exit 0; an inference worker runs and is ready. Pods being deleted are
/// removed at once (the kubelet's part of a graceful delete), unless `slow_to_stop`.
async fn kubelet(
    pods: Api<Pod>,
    namespace: String,
    node_root: PathBuf,
    seen: Arc<Mutex<Vec<Pod>>>,
    held: Arc<AtomicBool>,
    manual_train: Arc<AtomicBool>,
    slow_to_stop: Arc<AtomicBool>,
) {
    let mut handled = HashSet::new();
    let mut nodes = NodeHeartbeats::new(pods.clone().into_client());
    loop {
        let listed = match pods.list(&ListParams::default()).await {
            Ok(listed) => listed.items,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        nodes.beat(listed.iter().filter_map(|pod| pod.spec.as_ref()?.node_name.as_deref())).await;
        for pod in listed {
            let name = pod.metadata.name.clone().unwrap_or_default();
            if pod.metadata.deletion_timestamp.is_some() {
                if !slow_to_stop.load(Ordering::SeqCst) {
                    let _ =
                        pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
                }
                continue;
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if !handled.insert(uid) {
                continue;
            }
            seen.lock().expect("seen").push(pod.clone());
            if manual_train.load(Ordering::SeqCst)
                && label(&pod, "lifelonglearningjob.sedna.io/worker-type") == Some("train")
            {
                continue;
            }
            let pods = pods.clone();
            let (namespace, held, node_root) = (namespace.clone(), held.clone(), node_root.clone());
            tokio::spawn(async move { run_worker(&pods, &namespace, &node_root, &pod, &held).await });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The Node objects of the nodes the pods are on, as their kubelet keeps them: registered, and
/// Ready with a heartbeat. A pod bound to a node with no Node object is an orphan to
/// kube-controller-manager's pod GC, which force-deletes it (the "vanished" workers that the
/// operator made again, one test run in ten); a node gone silent is tainted and its pods evicted.
struct NodeHeartbeats {
    nodes: Api<Node>,
    last: HashMap<String, Instant>,
}

impl NodeHeartbeats {
    /// Well inside kube-controller-manager's 40 s node-monitor grace period.
    const EVERY: Duration = Duration::from_secs(10);

    fn new(client: kube::Client) -> NodeHeartbeats {
        NodeHeartbeats { nodes: Api::all(client), last: HashMap::new() }
    }

    /// Registers the nodes not seen before, and beats for those whose last beat is due.
    async fn beat<'a>(&mut self, on: impl Iterator<Item = &'a str>) {
        for name in on {
            if !self.last.contains_key(name) {
                let node = json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"perennial.io/test": "cluster"}}});
                // Already there (another test's world, or the test itself made it): kept. Any
                // other failure: tried again at the next beat.
                let made =
                    self.nodes.create(&PostParams::default(), &serde_json::from_value(node).expect("a node")).await;
                if made.is_ok() || matches!(&made, Err(kube::Error::Api(status)) if status.code == 409) {
                    self.last.insert(name.to_owned(), Instant::now() - Self::EVERY);
                }
            }
        }
        let heartbeat = jiff::Timestamp::now().to_string();
        let status = json!({"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "the test plays the kubelet",
            "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat,
        }]}});
        for (name, last) in &mut self.last {
            if last.elapsed() >= Self::EVERY {
                let _ = self.nodes.patch_status(name, &PatchParams::default(), &Patch::Strategic(&status)).await;
                *last = Instant::now();
            }
        }
    }
}

async fn run_worker(pods: &Api<Pod>, namespace: &str, node_root: &Path, pod: &Pod, held: &AtomicBool) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let kind = label(pod, "lifelonglearningjob.sedna.io/worker-type").unwrap_or_default().to_owned();
    let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::running())).await;
    if kind == "inference" {
        return;
    }
    // A real worker runs for a while: it reports once the operator has seen it running (the
    // job's status says so), so that the Running condition is there to be checked.
    until_job_running(pods, pod, &kind).await;
    while held.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let body = sedna_worker::report_on(pod, namespace, &kind, node_root);
    let env = sedna_worker::env_of(pod);
    let url = format!("{}/sedna/workers/{}/info", env["LC_SERVER"], env["WORKER_NAME"]);
    let http = reqwest::Client::new();
    // Sedna's library retries too.
    for _ in 0..300 {
        match http.post(&url).json(&body).timeout(Duration::from_secs(5)).send().await {
            Ok(response) if response.status().is_success() => break,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::succeeded())).await;
}
