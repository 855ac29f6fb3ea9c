//! The API server the cluster benches run on (an admin kubeconfig from `up`): its client, URL and
//! CA, `kubectl`, the README's install, fresh namespaces, and what it costs (its requests by verb
//! and resource, and the CPU of kube-apiserver and etcd).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

use crate::measure;

pub struct Cluster {
    pub kubeconfig: PathBuf,
    /// The `up` state directory, whose pid files name kube-apiserver and etcd.
    pub state: PathBuf,
    pub server: String,
    pub ca_pem: Vec<u8>,
    pub client: kube::Client,
}

impl Cluster {
    pub async fn new(kubeconfig: PathBuf) -> Cluster {
        let config = Kubeconfig::read_from(&kubeconfig)
            .unwrap_or_else(|err| panic!("{}: not a kubeconfig: {err}", kubeconfig.display()));
        let named = config.clusters.first().and_then(|c| c.cluster.clone()).expect("a cluster in the kubeconfig");
        let server = named.server.clone().expect("the cluster's server");
        assert!(
            server.contains("127.0.0.1") || server.contains("localhost"),
            "the bench runs on 127.0.0.1 only, not {server}"
        );
        let ca_pem = match (&named.certificate_authority_data, &named.certificate_authority) {
            (Some(data), _) => {
                let bytes: k8s_openapi::ByteString = serde_json::from_value(json!(data.trim())).expect("base64");
                bytes.0
            }
            (None, Some(file)) => std::fs::read(file).expect("the cluster's CA file"),
            (None, None) => Vec::new(),
        };
        let options = KubeConfigOptions::default();
        let client =
            kube::Client::try_from(kube::Config::from_custom_kubeconfig(config, &options).await.expect("config"))
                .expect("kube client");
        let state = std::env::var_os("PERENNIAL_BENCH_K8S_STATE")
            .map(PathBuf::from)
            .unwrap_or_else(|| kubeconfig.parent().map(Path::to_path_buf).unwrap_or_default());
        Cluster { kubeconfig, state, server, ca_pem, client }
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        let kubectl = std::env::var("PERENNIAL_TEST_KUBECTL")
            .ok()
            .and_then(|list| list.split(':').next().filter(|k| !k.is_empty()).map(str::to_owned))
            .unwrap_or_else(|| "kubectl".to_owned());
        let output = Command::new(&kubectl)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
            .output()
            .unwrap_or_else(|err| panic!("running {kubectl}: {err}"));
        assert!(
            output.status.success(),
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The CRDs, `deploy/operator` and `deploy/edge` (the operator's Role in the agents'
    /// namespace, whose pods it watches), as the README says.
    pub fn install(&self) {
        self.kubectl(&["apply", "-f", "deploy/crds/"]);
        self.kubectl(&["apply", "-k", "deploy/operator"]);
        self.kubectl(&["apply", "-k", "deploy/edge"]);
        for crd in ["crd/lifelonglearningjobs.sedna.io", "crd/datasets.sedna.io"] {
            self.kubectl(&["wait", "--timeout", "60s", "--for", "condition=Established", crd]);
        }
    }

    pub async fn namespace(&self, prefix: &str) -> String {
        let mut bytes = [0u8; 4];
        getrandom::fill(&mut bytes).expect("random");
        let name = format!("{prefix}-{}", hex::encode(bytes));
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
        Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
        name
    }

    /// CPU seconds used so far by kube-apiserver and etcd, if their pid files are found.
    pub fn control_plane_cpu(&self) -> Option<(f64, f64)> {
        measure::control_plane_cpu(&self.state)
    }

    /// `apiserver_request_total` by "VERB resource[/subresource]".
    pub async fn requests(&self) -> BTreeMap<String, f64> {
        measure::apiserver_requests(&self.client).await
    }
}
