//! The cluster suite's parts: the API server given by `PERENNIAL_TEST_KUBECONFIG`, `kubectl`
//! (every one named by `PERENNIAL_TEST_KUBECTL`), fresh namespaces, ServiceAccount tokens minted
//! with TokenRequest, and `perennial operator` / `perennial edge` as child processes with their
//! logs in files.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

/// The repository's root (the README's commands run from there).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The API server under test.
pub struct Cluster {
    pub kubeconfig: PathBuf,
    pub server: String,
    /// The server's CA, PEM.
    pub ca_pem: Vec<u8>,
}

/// The cluster from `PERENNIAL_TEST_KUBECONFIG` (an admin's kubeconfig). Without it the suite
/// fails: a cluster suite that did not run must never look green.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        perennial_tls::install_crypto_provider();
        let Some(path) = std::env::var_os("PERENNIAL_TEST_KUBECONFIG") else {
            panic!(
                "PERENNIAL_TEST_KUBECONFIG is not set: the cluster suite needs a Kubernetes API server. \
                 Run the tests with `scripts/test`, which finds or starts one (and installs what the \
                 other tests need); or set PERENNIAL_TEST_KUBECONFIG to an admin kubeconfig"
            )
        };
        let kubeconfig = PathBuf::from(path);
        let config = Kubeconfig::read_from(&kubeconfig).expect("PERENNIAL_TEST_KUBECONFIG reads as a kubeconfig");
        let cluster = config.clusters.first().and_then(|c| c.cluster.clone()).expect("a cluster in the kubeconfig");
        let server = cluster.server.clone().expect("the cluster's server");
        let ca_pem = match (&cluster.certificate_authority_data, &cluster.certificate_authority) {
            (Some(data), _) => base64_decode(data),
            (None, Some(file)) => std::fs::read(file).expect("the cluster's CA file"),
            (None, None) => Vec::new(),
        };
        Cluster { kubeconfig, server, ca_pem }
    })
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value: k8s_openapi::ByteString = serde_json::from_value(json!(text.trim())).expect("base64");
    value.0
}

impl Cluster {
    /// An admin client (one per test: each test has its own runtime).
    pub async fn client(&self) -> kube::Client {
        let config = Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default()).await.expect("kube config");
        kube::Client::try_from(config).expect("kube client")
    }

    /// The kubectl binaries to run the README's commands with: `PERENNIAL_TEST_KUBECTL`, a list
    /// separated by `:` (e.g. Debian's 1.20 and a current one), or `kubectl` on the PATH.
    pub fn kubectls(&self) -> Vec<String> {
        match std::env::var("PERENNIAL_TEST_KUBECTL") {
            Ok(list) if !list.trim().is_empty() => list.split(':').map(str::to_owned).collect(),
            _ => vec!["kubectl".to_owned()],
        }
    }

    /// `kubectl ARGS` (the first of [`Cluster::kubectls`]) as the admin, from the repository's root.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with(&self.kubectls()[0], args)
    }

    pub fn kubectl_with(&self, kubectl: &str, args: &[&str]) -> Output {
        Command::new(kubectl)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .current_dir(repo())
            .output()
            .unwrap_or_else(|err| panic!("running {kubectl}: {err}"))
    }

    /// `kubectl ARGS` that must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(
            output.status.success(),
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Held while cluster-wide objects (the CRDs, `deploy/operator`) are applied: two client-side
    /// applies of an object that does not exist yet both create it, and one fails with
    /// AlreadyExists. Not reentrant: never call [`Cluster::install`] while holding it.
    pub fn applying_cluster_wide(&self) -> MutexGuard<'static, ()> {
        static APPLYING: Mutex<()> = Mutex::new(());
        APPLYING.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Held by the tests that run an operator with its own pod in `perennial-system` (the leader
    /// labels it, and takes the label off every other pod there).
    pub async fn labelling_operator_pods(&self) -> tokio::sync::MutexGuard<'static, ()> {
        static LABELLING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        LABELLING.lock().await
    }

    /// The CRDs, `deploy/operator` (the operator's ServiceAccount and RBAC) and `deploy/edge`,
    /// applied once per test process, as the README says.
    pub fn install(&self) {
        static INSTALLED: OnceLock<()> = OnceLock::new();
        INSTALLED.get_or_init(|| {
            let _applying = self.applying_cluster_wide();
            self.kubectl_ok(&["apply", "-f", "deploy/crds/"]);
            self.kubectl_ok(&["apply", "-k", "deploy/operator"]);
            // The edge agents' namespace, with the operator's Role there (it watches their pods).
            self.kubectl_ok(&["apply", "-k", "deploy/edge"]);
            self.kubectl_ok(&["wait", "--for", "condition=Established", "crd/lifelonglearningjobs.sedna.io"]);
            self.kubectl_ok(&["wait", "--for", "condition=Established", "crd/datasets.sedna.io"]);
        });
    }

    /// A fresh namespace `PREFIX-<random>`, labelled `perennial.io/test=cluster`.
    pub async fn namespace(&self, client: &kube::Client, prefix: &str) -> String {
        let mut bytes = [0u8; 4];
        getrandom::fill(&mut bytes).expect("random");
        let name = format!("{prefix}-{}", hex::encode(bytes));
        // Labelled, so that a real cluster can be cleaned: `kubectl delete ns -l perennial.io/test`.
        let metadata = json!({"name": name, "labels": {"perennial.io/test": "cluster"}});
        let namespace: Namespace = serde_json::from_value(json!({ "metadata": metadata })).expect("namespace");
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
        name
    }

    /// A kubeconfig that authenticates as ServiceAccount `namespace/name` (TokenRequest).
    pub async fn service_account_kubeconfig(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
        dir: &Path,
    ) -> PathBuf {
        crate::service_account::service_account_kubeconfig(client, (&self.server, &self.ca_pem), namespace, name, dir)
            .await
    }

    /// A Secret `namespace/name` with `data`.
    pub async fn secret(&self, client: &kube::Client, namespace: &str, name: &str, data: &[(&str, &str)]) {
        let string_data: serde_json::Map<String, serde_json::Value> =
            data.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
        let secret: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "stringData": string_data})).expect("secret");
        Api::<Secret>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &secret)
            .await
            .expect("create the secret");
    }
}

/// Held by a test that runs `deploy/operator`'s pods (its Deployment and Lease are one per
/// cluster): the rollout test and the README's walk-through take turns.
pub fn operator_deployment() -> &'static tokio::sync::Mutex<()> {
    static DEPLOYMENT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    &DEPLOYMENT
}

impl Cluster {
    /// `deploy/operator`'s Deployment as a fresh install has it, for the holder of
    /// [`operator_deployment`]: deleted, and applied again when `reapply`. Installed at the
    /// suite's start with no kubelet to run its pods, it is marked ProgressDeadlineExceeded 600 s
    /// on, and `kubectl rollout status` then fails at once (a slow machine's suite gets there).
    pub fn fresh_operator_deployment(&self, reapply: bool) {
        self.kubectl_ok(&[
            "delete",
            "deployment",
            "perennial-operator",
            "-n",
            "perennial-system",
            "--ignore-not-found",
        ]);
        if reapply {
            let _applying = self.applying_cluster_wide();
            self.kubectl_ok(&["apply", "-k", "deploy/operator"]);
        }
    }
}

/// A free port on 127.0.0.1 (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// A `perennial` child process whose output goes to a log file; killed when dropped.
pub struct Process {
    pub child: Child,
    pub log: PathBuf,
}

impl Process {
    pub fn start(args: &[String], log: PathBuf, env: &[(&str, &str)]) -> Process {
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_perennial"))
            .args(args)
            .envs(env.iter().copied())
            .env_remove("KUBECONFIG")
            .stdout(Stdio::from(file.try_clone().expect("log")))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start perennial");
        Process { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The kubelet's stop: SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub async fn terminate(&mut self, grace: Duration) {
        self.stop_within(grace).await;
        self.kill();
    }

    /// SIGTERM, and how the process exited if it did within `within`.
    pub async fn stop_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().ok().flatten() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL, and wait for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An operator's counter `series` (its name and labels, as `/metrics` prints them) from its
/// `/metrics` on `metrics_port`; 0 before it first counts.
pub async fn operator_counter(metrics_port: u16, series: &str) -> u64 {
    let text = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let line = format!("{series} ");
    text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0, |n| n.trim().parse().expect("a count"))
}

/// Waits until `done` answers `Some`, checking every 50 ms; panics with `what` after `limit`.
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut done: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = done().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
