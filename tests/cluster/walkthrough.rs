//! The cluster guide's walk-through (`docs/src/guides/cluster.md`), run as written: each `sh` block marked
//! `<!-- walkthrough: cluster -->`, in order, with bash, in a folder of its own holding a copy of
//! `deploy/`, as the cluster's admin. The test plays what a cluster has and this machine lacks:
//! the kubelet — it runs each pod of `deploy/operator` as `perennial operator` and each pod of
//! `deploy/edge`'s DaemonSet as `perennial edge`, from the pod's own env and volumes (Secrets,
//! host paths under a folder playing the node's `/`, the projected token minted by TokenRequest
//! and bound to the pod), and reports them Ready as their probes would; the cluster's DNS and the
//! link's Service (a proxy to the pod in the Service's Endpoints); and Sedna's workers.
//! kube-controller-manager (`up --controller-manager`) makes the ReplicaSets and the DaemonSet's
//! pods, as on a real cluster.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Secret, ServiceAccount, Volume};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};

use crate::harness::{Cluster, Process, cluster, free_port, repo, until};
use crate::stack;

/// The walk-through's names: the edge node, the job, the operator's and the agents' namespaces.
const EDGE_NODE: &str = "edge-1";
const JOB: &str = "thermal";
const SYSTEM: &str = "perennial-system";
const EDGE: &str = "perennial-edge";
/// The node the test's kubelet runs the operator's pods on.
const CLOUD_NODE: &str = "walkthrough-cloud-1";
/// The marker of the walk-through's blocks in the cluster guide.
const MARKER: &str = "<!-- walkthrough: cluster -->";

/// The cluster guide's walk-through.
const GUIDE: &str = "docs/src/guides/cluster.md";

/// The `sh` blocks of the cluster guide that follow [`MARKER`], in order.
fn walkthrough_blocks() -> Vec<String> {
    let guide = std::fs::read_to_string(repo().join(GUIDE)).expect(GUIDE);
    let mut blocks = Vec::new();
    let mut lines = guide.lines();
    while let Some(line) = lines.next() {
        if line.trim() != MARKER {
            continue;
        }
        assert_eq!(lines.next().map(str::trim), Some("```sh"), "a `sh` block follows {MARKER}");
        let block: Vec<&str> = lines.by_ref().take_while(|line| line.trim() != "```").collect();
        blocks.push(block.join("\n") + "\n");
    }
    blocks
}

/// Where the walk-through runs: its folder (the reader's shell), the folder playing the edge
/// node's `/`, and the reader's kubeconfig (the admin's, in this test's namespace).
struct Reader {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    kubectl: String,
}

impl Reader {
    async fn new(cluster: &'static Cluster, namespace: &str) -> Reader {
        let dir = tempfile::tempdir().expect("tempdir");
        let copied = std::process::Command::new("cp")
            .args(["-r", &repo().join("deploy").display().to_string(), &dir.path().display().to_string()])
            .status()
            .expect("cp");
        assert!(copied.success(), "copying deploy/");
        // The reader's kubeconfig: the admin's, its context in this test's namespace.
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::copy(&cluster.kubeconfig, &kubeconfig).expect("kubeconfig");
        let kubectl = cluster.kubectls().last().cloned().expect("a kubectl");
        let set = std::process::Command::new(&kubectl)
            .args(["config", "set-context", "--current", "--namespace", namespace])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .expect("kubectl config");
        assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
        Reader { dir, kubeconfig, kubectl }
    }

    /// Runs `block` with `bash -euo pipefail` as a reader would paste it; its output, or what
    /// went wrong.
    async fn run(&self, block: &str, limit: Duration) -> Result<String, String> {
        let kubectl_dir = Path::new(&self.kubectl).parent().map(Path::to_path_buf).unwrap_or_default();
        let path = format!("{}:{}", kubectl_dir.display(), std::env::var("PATH").unwrap_or_default());
        let output = self.dir.path().join("block.out");
        let file = std::fs::File::create(&output).expect("the block's output");
        let mut child = std::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", block])
            .current_dir(self.dir.path())
            .env("PATH", path)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdout(Stdio::from(file.try_clone().expect("output")))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("bash");
        let deadline = std::time::Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().expect("bash runs") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let text = std::fs::read_to_string(&output).unwrap_or_default();
                return Err(format!("the walk-through's block did not finish in {limit:?}:\n{block}\n---\n{text}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let text = std::fs::read_to_string(&output).unwrap_or_default();
        if !status.success() {
            return Err(format!("the walk-through's block failed ({status}):\n{block}\n---\n{text}"));
        }
        Ok(text)
    }
}

/// One pod's process, as the test's kubelet runs it.
struct Container {
    process: Process,
    /// Where its readiness is read: an HTTP URL (`/readyz`) or a TCP address that must accept.
    probe: Probe,
    /// The operator's link port (the Service's `targetPort: link`).
    link_port: Option<u16>,
    /// Its pod's IP (each its own, as the Endpoints controller expects).
    ip: String,
}

#[derive(Clone)]
enum Probe {
    Http(String),
    Tcp(u16),
}

impl Probe {
    async fn ready(&self) -> bool {
        match self {
            Probe::Http(url) => matches!(
                reqwest::Client::new().get(url).timeout(Duration::from_secs(1)).send().await,
                Ok(response) if response.status().is_success()
            ),
            Probe::Tcp(port) => TcpStream::connect(("127.0.0.1", *port)).await.is_ok(),
        }
    }
}

/// What the kubelet knows of this machine: the test's namespace, where the pods' files go, the
/// ports the operator's and the agent's pods are given in place of their fixed ones.
struct Machine {
    client: kube::Client,
    namespace: String,
    /// The edge node's `/` (host paths of the DaemonSet and the jobs).
    node_root: PathBuf,
    /// The pods' volumes.
    pods_dir: PathBuf,
    /// The operator's kubeconfig as its ServiceAccount (what its pod's automounted token gives).
    operator_kubeconfig: PathBuf,
    /// The agent's worker API (Sedna's BIND_PORT), where the operator's LC_SERVER points.
    edge_port: u16,
    /// The link Service's address on this machine.
    service_port: u16,
    running: Mutex<HashMap<String, Container>>,
    next_ip: std::sync::atomic::AtomicU32,
}

impl Machine {
    /// The link port of the pod the Service's Endpoints name (the leader's).
    async fn service_backend(&self) -> Option<u16> {
        let endpoints: Api<Endpoints> = Api::namespaced(self.client.clone(), SYSTEM);
        let named = endpoints.get("perennial-operator").await.ok()?;
        let pod = named
            .subsets
            .into_iter()
            .flatten()
            .flat_map(|subset| subset.addresses.into_iter().flatten())
            .find_map(|address| address.target_ref.and_then(|target| target.name))?;
        self.running.lock().expect("running").get(&pod).and_then(|container| container.link_port)
    }
}

/// The link's Service: each connection to `service_port` goes to the pod its Endpoints name.
async fn service(machine: Arc<Machine>, listener: TcpListener) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else { continue };
        let machine = machine.clone();
        tokio::spawn(async move {
            let Some(port) = machine.service_backend().await else {
                let _ = inbound.shutdown().await;
                return;
            };
            if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", port)).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// The kubelet and heartbeat of the two nodes, for the pods of `deploy/operator` and `deploy/edge`.
async fn kubelet(machine: Arc<Machine>, stop: Arc<AtomicBool>) {
    let nodes: Api<Node> = Api::all(machine.client.clone());
    for node in [CLOUD_NODE, EDGE_NODE] {
        // What a kubelet labels its node with: deploy/edge's DaemonSet runs only where
        // `kubernetes.io/arch` names an architecture it has a build for.
        let labels =
            json!({"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "kubernetes.io/hostname": node});
        let object = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}});
        let _ = nodes.create(&PostParams::default(), &serde_json::from_value(object).expect("a node")).await;
    }
    let selected = [
        (SYSTEM, "app.kubernetes.io/name=perennial-operator", CLOUD_NODE),
        (EDGE, "app.kubernetes.io/name=perennial-edge", EDGE_NODE),
    ];
    while !stop.load(Ordering::SeqCst) {
        let heartbeat = jiff::Timestamp::now().to_string();
        let status = json!({"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "the test plays the kubelet",
            "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat,
        }]}});
        for node in [CLOUD_NODE, EDGE_NODE] {
            let _ = nodes.patch_status(node, &PatchParams::default(), &Patch::Strategic(&status)).await;
        }
        for (namespace, selector, node) in selected {
            let pods: Api<Pod> = Api::namespaced(machine.client.clone(), namespace);
            let Ok(listed) = pods.list(&ListParams::default().labels(selector)).await else { continue };
            for pod in listed.items {
                tend(&machine, &pods, pod, node).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// One pod: stopped if deleted, bound, started, its readiness reported.
async fn tend(machine: &Machine, pods: &Api<Pod>, pod: Pod, node: &str) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        let stopping = machine.running.lock().expect("running").remove(&name);
        if let Some(mut container) = stopping {
            container.process.terminate(Duration::from_secs(30)).await;
        }
        let _ = pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
        return;
    }
    let Some(pod) = bound(pods, pod, node).await else { return };
    let started = machine.running.lock().expect("running").contains_key(&name);
    if !started {
        // Not yet startable (a Secret it mounts is not there yet): tried again on the next pass.
        let Some(container) = start(machine, &pod).await else { return };
        machine.running.lock().expect("running").insert(name.clone(), container);
    }
    let running = machine.running.lock().expect("running").get(&name).map(|c| (c.probe.clone(), c.ip.clone()));
    let Some((probe, ip)) = running else { return };
    let ready = probe.ready().await;
    let container = pod.spec.as_ref().and_then(|spec| spec.containers.first()).map(|c| c.name.clone());
    let status = json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [
            {"type": "Ready", "status": if ready { "True" } else { "False" }},
            {"type": "ContainersReady", "status": if ready { "True" } else { "False" }},
        ],
        "containerStatuses": [{
            "name": container, "ready": ready, "restartCount": 0, "image": "perennial",
            "imageID": "", "started": true, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        }],
    }});
    let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
}

/// The pod bound to a node: the scheduler's part, to the node its affinity names (a
/// DaemonSet's pod) or else `node`.
async fn bound(pods: &Api<Pod>, pod: Pod, node: &str) -> Option<Pod> {
    if pod.spec.as_ref().and_then(|spec| spec.node_name.as_ref()).is_some() {
        return Some(pod);
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = serde_json::to_value(&pod.spec).unwrap_or_default();
    let affinity = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    let named = affinity["nodeSelectorTerms"][0]["matchFields"][0]["values"][0].as_str().unwrap_or(node).to_owned();
    if named != node {
        // A DaemonSet's pod for another node (one left by an earlier run): not this kubelet's.
        return None;
    }
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
    pods.create_subresource::<Value, Value>("binding", &name, &PostParams::default(), &binding).await.ok()?;
    pods.get(&name).await.ok()
}

/// Starts the pod's one container as a `perennial` process: its env with the downward API
/// filled in, paths under its volumes' mounts moved to where the kubelet put them, and what
/// differs on a shared test machine (ports, the cluster's DNS) given instead. `None` while a
/// volume cannot be made yet.
async fn start(machine: &Machine, pod: &Pod) -> Option<Container> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let spec = pod.spec.as_ref().expect("a pod spec");
    let container = spec.containers.first().expect("a container");
    let command = container.command.clone().unwrap_or_default();
    assert_eq!(command.first().map(String::as_str), Some("perennial"), "{name} runs perennial");
    let mounts = volumes(machine, pod).await?;
    let mut env: Vec<(String, String)> = Vec::new();
    for var in container.env.iter().flatten() {
        let value = match (&var.value, var.value_from.as_ref().and_then(|from| from.field_ref.as_ref())) {
            (Some(value), _) => value.clone(),
            (None, Some(field)) => match field.field_path.as_str() {
                "metadata.name" => name.clone(),
                "metadata.namespace" => namespace.clone(),
                "spec.nodeName" => spec.node_name.clone().unwrap_or_default(),
                other => panic!("env {} of {name}: {other} is not filled in by the test's kubelet", var.name),
            },
            (None, None) => panic!("env {} of {name}: nothing the test's kubelet can fill in", var.name),
        };
        env.push((var.name.clone(), on_this_machine(&mounts, &value)));
    }
    let cloud_url = env.iter().find(|(key, _)| key == "PERENNIAL_CLOUD_URL").map(|(_, url)| url.clone());
    let mut set = |key: &str, value: String| {
        env.retain(|(name, _)| name != key);
        env.push((key.to_owned(), value));
    };
    set("RUST_LOG", "info".to_owned());
    let mut args: Vec<String> = command[1..].to_vec();
    let (probe, link_port) = match command.get(1).map(String::as_str) {
        Some("operator") => {
            let (metrics, link) = (free_port(), free_port());
            set("PERENNIAL_METRICS_ADDR", format!("127.0.0.1:{metrics}"));
            set("PERENNIAL_LINK_ADDR", format!("127.0.0.1:{link}"));
            set("PERENNIAL_LC_SERVER", format!("http://127.0.0.1:{}", machine.edge_port));
            // Other tests' jobs share this API server: this operator reconciles this test's only.
            set("PERENNIAL_NAMESPACE", machine.namespace.clone());
            args.extend(["--kubeconfig".to_owned(), machine.operator_kubeconfig.display().to_string()]);
            (Probe::Http(format!("http://127.0.0.1:{metrics}/readyz")), Some(link))
        }
        Some("edge") => {
            set("BIND_PORT", machine.edge_port.to_string());
            // The cluster's DNS: the Service's name, here on a loopback port; its certificate
            // is checked against the name the pod dials.
            let url = cloud_url.expect("the agent's PERENNIAL_CLOUD_URL");
            let host = url.trim_start_matches("wss://").split([':', '/']).next().unwrap_or_default().to_owned();
            set("PERENNIAL_CLOUD_URL", format!("wss://127.0.0.1:{}/v1/link", machine.service_port));
            set("PERENNIAL_CLOUD_SERVER_NAME", host);
            (Probe::Tcp(machine.edge_port), None)
        }
        other => panic!("{name} runs perennial {other:?}: not what the walk-through installs"),
    };
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let log = machine.pods_dir.join(format!("{name}.log"));
    let ip = format!("10.98.0.{}", machine.next_ip.fetch_add(1, Ordering::SeqCst));
    Some(Container { process: Process::start(&args, log, &env), probe, link_port, ip })
}

/// A path in the container as this machine has it: under the volume mounted there.
fn on_this_machine(mounts: &[(String, PathBuf)], value: &str) -> String {
    for (mount_path, on_host) in mounts {
        let mount_path = mount_path.trim_end_matches('/');
        if let Some(rest) = value.strip_prefix(mount_path)
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return format!("{}{rest}", on_host.display());
        }
    }
    value.to_owned()
}

/// The pod's volumes made as the kubelet makes them; (mount path, folder here) for each mount.
async fn volumes(machine: &Machine, pod: &Pod) -> Option<Vec<(String, PathBuf)>> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let spec = pod.spec.as_ref().expect("a pod spec");
    let dir = machine.pods_dir.join(&name);
    let mut made: HashMap<String, PathBuf> = HashMap::new();
    for volume in spec.volumes.iter().flatten() {
        made.insert(volume.name.clone(), volume_here(machine, pod, &namespace, &dir, volume).await?);
    }
    let container = spec.containers.first().expect("a container");
    let mut mounts: Vec<(String, PathBuf)> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|mount| (mount.mount_path.clone(), made[&mount.name].clone()))
        .collect();
    // The longest mount path first: `/var/lib/perennial` before `/`.
    mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    Some(mounts)
}

async fn volume_here(machine: &Machine, pod: &Pod, namespace: &str, dir: &Path, volume: &Volume) -> Option<PathBuf> {
    let here = dir.join(&volume.name);
    if let Some(host) = &volume.host_path {
        let on_node = machine.node_root.join(host.path.trim_start_matches('/'));
        std::fs::create_dir_all(&on_node).expect("a host path");
        return Some(on_node);
    }
    std::fs::create_dir_all(&here).expect("a volume");
    if let Some(secret) = &volume.secret {
        let secret_name = secret.secret_name.clone().expect("a secret volume names its Secret");
        let secrets: Api<Secret> = Api::namespaced(machine.client.clone(), namespace);
        // The kubelet waits for the Secret: the pod starts once it exists.
        let read = secrets.get(&secret_name).await.ok()?;
        for (key, value) in read.data.into_iter().flatten() {
            std::fs::write(here.join(key), value.0).expect("a secret's key");
        }
    }
    if let Some(projected) = &volume.projected {
        for source in projected.sources.iter().flatten() {
            if let Some(token) = &source.service_account_token {
                let minted = bound_token(machine, pod, token.audience.as_deref(), token.expiration_seconds).await;
                std::fs::write(here.join(&token.path), minted).expect("the projected token");
            }
        }
    }
    Some(here)
}

/// A token of the pod's ServiceAccount bound to the pod: what a projected volume holds.
async fn bound_token(machine: &Machine, pod: &Pod, audience: Option<&str>, expiration: Option<i64>) -> String {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let account = pod.spec.as_ref().and_then(|spec| spec.service_account_name.clone()).unwrap_or("default".into());
    let accounts: Api<ServiceAccount> = Api::namespaced(machine.client.clone(), &namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audience.map(str::to_owned).into_iter().collect(),
            expiration_seconds: expiration.or(Some(3600)),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..TokenRequest::default()
    };
    let minted = accounts.create_token_request(&account, &PostParams::default(), &request).await.expect("TokenRequest");
    minted.status.expect("the TokenRequest has a status").token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_guides_walkthrough_runs_as_written() {
    let blocks = walkthrough_blocks();
    assert_eq!(blocks.len(), 4, "{GUIDE}'s walk-through: install, edge node, job, follow it");
    let cluster = cluster();
    cluster.install();
    // deploy/operator's pods and Lease are the rollout test's too.
    let _operator_pods = crate::harness::operator_deployment().lock().await;
    // Installed as the guide's first block does it, on a cluster without it yet.
    cluster.fresh_operator_deployment(false);
    let client = cluster.client().await;
    let namespace = cluster.namespace(&client, "walkthrough").await;
    // What an earlier run against the same API server left of the walk-through's own objects.
    for (namespace, secret) in [(SYSTEM, "perennial-link-tls"), (EDGE, "perennial-link-ca")] {
        let _ = Api::<Secret>::namespaced(client.clone(), namespace).delete(secret, &DeleteParams::default()).await;
    }
    let reader = Reader::new(cluster, &namespace).await;
    let node_root = reader.dir.path().join("edge-1-root");
    let pods_dir = reader.dir.path().join("pods");
    std::fs::create_dir_all(&pods_dir).expect("pods dir");
    // The node's data: the dataset's index exists before its job (a node's data does).
    let index = node_root.join("data/readings/index.txt");
    std::fs::create_dir_all(index.parent().expect("parent")).expect("data dir");
    std::fs::write(&index, "").expect("index");
    let operator_kubeconfig =
        cluster.service_account_kubeconfig(&client, SYSTEM, "perennial-operator", reader.dir.path()).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("the Service's port");
    let machine = Arc::new(Machine {
        client: client.clone(),
        namespace: namespace.clone(),
        node_root: node_root.clone(),
        pods_dir: pods_dir.clone(),
        operator_kubeconfig,
        edge_port: free_port(),
        service_port: listener.local_addr().expect("address").port(),
        running: Mutex::new(HashMap::new()),
        next_ip: 2.into(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let kubelet_task = tokio::spawn(kubelet(machine.clone(), stop.clone()));
    let service_task = tokio::spawn(service(machine.clone(), listener));
    let workers =
        stack::play_workers(Api::namespaced(client.clone(), &namespace), namespace.clone(), node_root.clone());
    let logs = || {
        let mut text = String::new();
        for entry in std::fs::read_dir(&pods_dir).into_iter().flatten().flatten() {
            if entry.path().extension().is_some_and(|e| e == "log") {
                let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                text.push_str(&format!("----- {} -----\n", entry.path().display()));
                text.push_str(&lines[lines.len().saturating_sub(60)..].join("\n"));
                text.push('\n');
            }
        }
        text
    };

    // The operator installed, its link's certificate made: both replicas roll out.
    let must = |ran: Result<String, String>| ran.unwrap_or_else(|err| panic!("{err}\n{}", logs()));
    must(reader.run(&blocks[0], Duration::from_secs(240)).await);
    // An edge node: the DaemonSet's agent on `edge-1`, linked with its pod's token.
    must(reader.run(&blocks[1], Duration::from_secs(180)).await);
    // The job on it.
    must(reader.run(&blocks[2], Duration::from_secs(60)).await);

    // Samples arrive on the node; a round goes through and deploys its model.
    // 200 samples: with trainProb 0.8, over the trigger's 100 in the train set.
    let samples: String = (0..200).map(|n| format!("images/{n}.png {}\n", n % 3)).collect();
    std::fs::write(&index, samples).expect("samples");
    let jobs: Api<perennial_api::LifelongLearningJob> = Api::namespaced(client.clone(), &namespace);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let job = jobs.get_opt(JOB).await.ok().flatten().map(|job| serde_json::to_value(job).expect("json"));
        if let Some(job) = &job
            && job["status"]["deployed"]["round"].as_u64() >= Some(1)
        {
            break;
        }
        if std::time::Instant::now() > deadline {
            let status = job.map(|job| job["status"].clone()).unwrap_or_default();
            panic!("round 1 was not deployed in 120 s: {status:#}\n{}", logs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Followed as the guide says.
    let followed =
        until("the round's events in the walk-through's `kubectl describe`", Duration::from_secs(30), || {
            let reader = &reader;
            let block = &blocks[3];
            async move {
                let text = reader.run(block, Duration::from_secs(30)).await.ok()?;
                text.contains("round 1: deploying").then_some(text)
            }
        })
        .await;
    let row = followed.lines().find(|line| line.starts_with(JOB)).expect("the job's row in `kubectl get ll`");
    let row: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(row[3], "1", "round 1 in `kubectl get ll`: {followed}");
    assert!(row[4].starts_with("/output/thermal/"), "the deployed model, a path on the node: {followed}");
    // One Event per stage: why the round started (the trigger's reason), what it evaluates, the
    // model it deploys.
    for said in ["round 1: triggered (num_of_samples", "round 1: evaluating /output/thermal/", "round 1: deploying /"] {
        assert_eq!(followed.matches(said).count(), 1, "{said:?} once in:\n{followed}");
    }

    // The job deleted, its finalizer released by the operator; then the pods stop.
    let job_namespace = namespace.clone();
    tokio::task::spawn_blocking(move || {
        cluster.kubectl_ok(&["delete", "ll", JOB, "-n", &job_namespace, "--timeout=60s"]);
    })
    .await
    .unwrap_or_else(|_| panic!("the job was not deleted (its finalizer kept it):\n{}", logs()));
    drop(workers);
    stop.store(true, Ordering::SeqCst);
    kubelet_task.await.expect("the test's kubelet");
    service_task.abort();
    machine.running.lock().expect("running").clear();
}
