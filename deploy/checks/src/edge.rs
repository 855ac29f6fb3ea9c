//! `deploy/edge/`, the two ways to put the edge agent on a node, checked for what a user relies
//! on. The DaemonSet as `kubectl apply -k deploy/edge` would install it: rendered by the real
//! `kubectl kustomize`, read back as Kubernetes' own type (a misspelt field fails), on the host's
//! network and filesystem, its state on the host, its identity a projected ServiceAccount token
//! (no Secret of node tokens), its CA from a Secret, its link to the operator's Service, on the
//! image's architectures only. `install.sh`, run for real under a scratch root: what it writes,
//! that it takes this node's build (from a folder of builds too), and that it refuses bad input
//! and a build for another machine before writing anything. The systemd unit it installs. And
//! every variable either sets is one `perennial edge` reads.
//!
//! Without `kubectl` the DaemonSet's tests skip, except under CI (`CI` set), where they fail.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, EnvVar, Namespace, PodSpec, ServiceAccount, Volume, VolumeMount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
#[cfg(test)]
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tempfile::TempDir;

use crate::repo_path;
use crate::typed::typed;

const NAME: &str = "perennial-edge";
/// The agent's own namespace (privileged: host network, host paths, root); the operator's
/// stays restricted.
const NAMESPACE: &str = "perennial-edge";
const OPERATOR_NAMESPACE: &str = "perennial-system";
const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "perennial");
const BIND_PORT: &str = "9100";
/// The agent's ServiceAccount, and the audience of its projected token (the operator's
/// `--link-audience` default, set in deploy/operator too).
const SERVICE_ACCOUNT: &str = "perennial-edge";
const AUDIENCE: &str = "perennial-link";

/// Where install.sh puts things on the node, and where the unit looks for them.
const BINARY: &str = "/usr/local/bin/perennial";
const ENV_FILE: &str = "/etc/perennial/edge.env";
const TOKEN: &str = "/etc/perennial/token";
const UNIT: &str = "/etc/systemd/system/perennial-edge.service";

/// Set by the environment, not by a flag of `perennial edge`.
pub const NOT_FLAGS: [&str; 1] = ["RUST_LOG"];

fn read_text(relative: &str) -> String {
    let path = repo_path(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
}

// ---- The DaemonSet ----

/// `kubectl kustomize deploy/edge`'s DaemonSet, read once; `None` when kubectl is missing
/// outside CI.
pub fn daemonset() -> Option<&'static DaemonSet> {
    static RENDERED: OnceLock<Option<DaemonSet>> = OnceLock::new();
    RENDERED.get_or_init(|| crate::kustomize("deploy/edge").map(|text| only_daemonset(&text))).as_ref()
}

/// `kubectl kustomize deploy/edge-trusting`'s DaemonSet (the agents running the operator's
/// compiles), read once.
pub fn trusting_daemonset() -> Option<&'static DaemonSet> {
    static RENDERED: OnceLock<Option<DaemonSet>> = OnceLock::new();
    RENDERED.get_or_init(|| crate::kustomize("deploy/edge-trusting").map(|text| only_daemonset(&text))).as_ref()
}

/// The rendered documents: the Namespace, the ServiceAccount, the operator's Role and its
/// binding, and the DaemonSet.
fn only_daemonset(text: &str) -> DaemonSet {
    let documents = crate::documents(text);
    let kinds: Vec<_> =
        documents.iter().map(|v| format!("{} {} {}", v["apiVersion"], v["kind"], v["metadata"]["name"])).collect();
    assert_eq!(
        kinds.len(),
        5,
        "deploy/edge renders five objects, the Namespace, the ServiceAccount, the operator's Role and \
         RoleBinding, and the DaemonSet: {kinds:?}"
    );
    let find = |api_version: &str, kind: &str| {
        documents
            .iter()
            .find(|v| v["apiVersion"] == api_version && v["kind"] == kind)
            .unwrap_or_else(|| panic!("deploy/edge renders no {kind}: {kinds:?}"))
    };
    assert_eq!((documents[0]["apiVersion"].as_str(), documents[0]["kind"].as_str()), (Some("v1"), Some("Namespace")));
    let namespace: Namespace = typed(&documents[0], "Namespace");
    assert_eq!(namespace.metadata.name.as_deref(), Some(NAMESPACE));
    let labels = namespace.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("pod-security.kubernetes.io/enforce").map(String::as_str),
        Some("privileged"),
        "the agent's pods use the host network, host paths and root: a restricted namespace refuses them"
    );
    let account: ServiceAccount = typed(find("v1", "ServiceAccount"), "ServiceAccount");
    assert_eq!(account.metadata.name.as_deref(), Some(SERVICE_ACCOUNT));
    assert_eq!(account.metadata.namespace.as_deref(), Some(NAMESPACE));
    operator_may_read_the_agents_pods_and_the_tokens_only(
        typed(find("rbac.authorization.k8s.io/v1", "Role"), "Role"),
        typed(find("rbac.authorization.k8s.io/v1", "RoleBinding"), "RoleBinding"),
    );
    typed(find("apps/v1", "DaemonSet"), "DaemonSet")
}

/// A rule as (API groups, resources, verbs, resource names).
type Rule = (Vec<String>, Vec<String>, Vec<String>, Vec<String>);

/// The operator's grants in the agents' namespace: their pods (a reviewed token's pod read, all
/// watched) and the one Secret of static node tokens, by name; bound to the operator's
/// ServiceAccount in its own namespace (kustomize must not have moved it).
fn operator_may_read_the_agents_pods_and_the_tokens_only(role: Role, binding: RoleBinding) {
    assert_eq!(role.metadata.namespace.as_deref(), Some(NAMESPACE));
    let mut rules: Vec<Rule> = role
        .rules
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            (
                r.api_groups.unwrap_or_default(),
                r.resources.unwrap_or_default(),
                r.verbs,
                r.resource_names.unwrap_or_default(),
            )
        })
        .collect();
    rules.sort();
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rules,
        [
            (strings(&[""]), strings(&["pods"]), strings(&["list", "watch"]), vec![]),
            (strings(&[""]), strings(&["secrets"]), strings(&["get"]), strings(&["perennial-edge-tokens"])),
        ],
        "the operator's Role in {NAMESPACE}"
    );
    assert_eq!(binding.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!((binding.role_ref.kind.as_str(), Some(&binding.role_ref.name)), ("Role", role.metadata.name.as_ref()));
    let subjects: Vec<_> = binding
        .subjects
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s.kind, s.name, s.namespace.unwrap_or_default()))
        .collect();
    assert_eq!(
        subjects,
        [("ServiceAccount".to_owned(), "perennial-operator".to_owned(), OPERATOR_NAMESPACE.to_owned())],
        "bound to the operator's ServiceAccount"
    );
}

/// A checked-in manifest outside deploy/edge, as its type.
fn manifest<K: DeserializeOwned + Serialize>(relative: &str) -> K {
    let value: Value =
        serde_yaml_ng::from_str(&read_text(relative)).unwrap_or_else(|err| panic!("{relative} is not YAML: {err}"));
    typed(&value, relative)
}

fn pod_spec(daemonset: &DaemonSet) -> &PodSpec {
    daemonset.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("the DaemonSet has a pod spec")
}

/// The container that runs `perennial edge`.
pub fn agent(daemonset: &DaemonSet) -> &Container {
    let containers = &pod_spec(daemonset).containers;
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

pub fn env(container: &Container) -> BTreeMap<&str, &EnvVar> {
    container.env.iter().flatten().map(|var| (var.name.as_str(), var)).collect()
}

/// The literal value of the container's variable `name`.
fn env_value<'a>(container: &'a Container, name: &str) -> &'a str {
    let var = env(container).get(name).copied();
    var.and_then(|v| v.value.as_deref()).unwrap_or_else(|| panic!("the DaemonSet sets no value for {name}"))
}

/// The mount that holds `path` (the deepest one) and its volume.
fn mount_of<'a>(daemonset: &'a DaemonSet, path: &str) -> (&'a VolumeMount, &'a Volume) {
    crate::mount_holding(pod_spec(daemonset), agent(daemonset), path)
        .unwrap_or_else(|| panic!("nothing is mounted at {path}"))
}

#[test]
fn renders_the_daemonset_in_its_own_privileged_namespace() {
    let Some(daemonset) = daemonset() else { return };
    let meta = &daemonset.metadata;
    assert_eq!(meta.name.as_deref(), Some(NAME));
    assert_eq!(meta.namespace.as_deref(), Some(NAMESPACE));
    let labels = meta.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(PART_OF.0).map(String::as_str), Some(PART_OF.1), "label {}: {labels:?}", PART_OF.0);
    let spec = daemonset.spec.as_ref().expect("the DaemonSet has a spec");
    let template_labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    let selector = spec.selector.match_labels.clone().unwrap_or_default();
    assert!(!selector.is_empty(), "the DaemonSet selects its pods by label");
    for (key, value) in &selector {
        assert_eq!(template_labels.get(key), Some(value), "the selector selects the pod template: {key}");
    }
}

#[test]
fn daemonset_runs_the_agent_on_the_host_network() {
    let Some(daemonset) = daemonset() else { return };
    let pod = pod_spec(daemonset);
    // Workers run on the host network and report to the agent on localhost:BIND_PORT.
    assert_eq!(pod.host_network, Some(true), "hostNetwork");
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"), "the link's Service name resolves");
    let container = agent(daemonset);
    assert_eq!(container.command.as_deref(), Some(&["perennial".to_owned(), "edge".to_owned()][..]));
    assert_eq!(env_value(container, "BIND_PORT"), BIND_PORT);
    // The same image as the operator's: one release.
    let operator: Deployment = manifest("deploy/operator/base/deployment.yaml");
    let operator_image = operator.spec.and_then(|s| s.template.spec).and_then(|s| s.containers.first()?.image.clone());
    assert_eq!(container.image, operator_image, "the agent's image is the operator's");
    // The kubelet creates the state's host path root-owned, and the jobs' files are the host's:
    // the image's nonroot user could write neither.
    let user = container.security_context.as_ref().and_then(|s| s.run_as_user);
    let pod_user = pod.security_context.as_ref().and_then(|s| s.run_as_user);
    assert_eq!(user.or(pod_user), Some(0), "the agent runs as root");
}

#[test]
fn daemonset_runs_only_on_the_images_architectures() {
    let Some(daemonset) = daemonset() else { return };
    let pod = pod_spec(daemonset);
    let required = pod.affinity.as_ref().and_then(|a| a.node_affinity.as_ref());
    let required = required.and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    let terms = &required.expect("a required node affinity").node_selector_terms;
    assert!(!terms.is_empty(), "node selector terms");
    // The terms are alternatives: each must keep to the image's platforms (the Dockerfile's
    // --platform linux/amd64,linux/arm64,linux/arm/v7, by the kubelet's GOARCH names).
    for term in terms {
        let arch = term.match_expressions.iter().flatten().find(|e| e.key == "kubernetes.io/arch");
        let arch = arch.unwrap_or_else(|| panic!("a node selector term without kubernetes.io/arch: {term:?}"));
        assert_eq!(arch.operator, "In");
        let mut values = arch.values.clone().unwrap_or_default();
        values.sort();
        assert_eq!(values, ["amd64", "arm", "arm64"], "the image's architectures");
    }
    let dockerfile = read_text("Dockerfile");
    assert!(
        dockerfile.contains("--platform linux/amd64,linux/arm64,linux/arm/v7"),
        "the Dockerfile builds the image for the three architectures"
    );
}

#[test]
fn host_filesystem_and_state_are_host_paths() {
    let Some(daemonset) = daemonset() else { return };
    let container = agent(daemonset);

    let rootfs = env_value(container, "ROOTFS_MOUNT_DIR");
    let (mount, volume) = mount_of(daemonset, rootfs);
    assert_eq!(
        mount.mount_path.trim_end_matches('/'),
        rootfs.trim_end_matches('/'),
        "the host's / is ROOTFS_MOUNT_DIR"
    );
    assert_ne!(mount.read_only, Some(true), "jobs write their outputs to host paths");
    let host = volume
        .host_path
        .as_ref()
        .unwrap_or_else(|| panic!("ROOTFS_MOUNT_DIR: volume {} is not a hostPath", volume.name));
    assert_eq!(host.path, "/", "ROOTFS_MOUNT_DIR holds the host's filesystem");

    // Queued reports are in the state: it outlives the pod.
    let state = env_value(container, "PERENNIAL_STATE_DIR");
    let (mount, volume) = mount_of(daemonset, state);
    assert_ne!(mount.read_only, Some(true), "the state is written");
    let host = volume
        .host_path
        .as_ref()
        .unwrap_or_else(|| panic!("PERENNIAL_STATE_DIR: volume {} is not a hostPath", volume.name));
    assert_ne!(host.path, "/", "the state has its own host folder");
    assert_eq!(host.type_.as_deref(), Some("DirectoryOrCreate"), "a new node gets the folder");
}

#[test]
fn identity_ca_and_node_name_come_from_the_cluster() {
    let Some(daemonset) = daemonset() else { return };
    let container = agent(daemonset);
    let pod = pod_spec(daemonset);
    // The agent proves its node with a token of its own ServiceAccount, bound to its pod.
    assert_eq!(pod.service_account_name.as_deref(), Some(SERVICE_ACCOUNT), "serviceAccountName");
    let token_file = env_value(container, "PERENNIAL_TOKEN_FILE");
    let (mount, volume) = mount_of(daemonset, token_file);
    assert_eq!(mount.read_only, Some(true), "PERENNIAL_TOKEN_FILE: mounted read only");
    let sources = volume.projected.as_ref().and_then(|p| p.sources.as_deref()).unwrap_or_else(|| {
        panic!("PERENNIAL_TOKEN_FILE: volume {} is not a projected serviceAccountToken", volume.name)
    });
    let token = sources
        .iter()
        .find_map(|s| s.service_account_token.as_ref())
        .unwrap_or_else(|| panic!("PERENNIAL_TOKEN_FILE: volume {} projects no serviceAccountToken", volume.name));
    assert_eq!(token.audience.as_deref(), Some(AUDIENCE), "the token is for the link only");
    let lifetime = token.expiration_seconds.unwrap_or(3600);
    assert!((600..=3600).contains(&lifetime), "a short-lived token (the kubelet rotates it): {lifetime} s");
    let file = format!("{}/{}", mount.mount_path.trim_end_matches('/'), token.path);
    assert_eq!(file, token_file, "PERENNIAL_TOKEN_FILE is the projected token's file");
    // No Secret of every node's token on any node.
    for volume in pod.volumes.iter().flatten() {
        let secret = volume.secret.as_ref().and_then(|s| s.secret_name.as_deref());
        assert_ne!(secret, Some("perennial-edge-tokens"), "the DaemonSet mounts no node tokens");
    }
    // The operator reviews for the same audience.
    let operator: Deployment = manifest("deploy/operator/base/deployment.yaml");
    let operator = operator.spec.and_then(|s| s.template.spec).and_then(|s| s.containers.into_iter().next());
    let audience = operator
        .and_then(|c| c.env)
        .and_then(|env| env.into_iter().find(|v| v.name == "PERENNIAL_LINK_AUDIENCE"))
        .and_then(|v| v.value);
    assert_eq!(audience.as_deref(), Some(AUDIENCE), "deploy/operator reviews the agents' tokens for their audience");

    let (mount, volume) = mount_of(daemonset, env_value(container, "PERENNIAL_CA_FILE"));
    assert_eq!(mount.read_only, Some(true), "PERENNIAL_CA_FILE: mounted read only");
    let secret = volume.secret.as_ref().and_then(|s| s.secret_name.as_deref());
    assert!(secret.is_some_and(|name| !name.is_empty()), "PERENNIAL_CA_FILE: volume {} is not a Secret", volume.name);
    let node = env(container).get("NODENAME").and_then(|v| v.value_from.as_ref()).and_then(|v| v.field_ref.as_ref());
    assert_eq!(node.map(|f| f.field_path.as_str()), Some("spec.nodeName"), "NODENAME is the pod's node");
}

#[test]
fn cloud_url_is_the_operators_link_service() {
    let Some(daemonset) = daemonset() else { return };
    let url = env_value(agent(daemonset), "PERENNIAL_CLOUD_URL");
    let rest = url.strip_prefix("wss://").unwrap_or_else(|| panic!("PERENNIAL_CLOUD_URL is not wss:// (TLS): {url}"));
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = authority.rsplit_once(':').unwrap_or_else(|| panic!("PERENNIAL_CLOUD_URL names no port: {url}"));

    let service: Service = manifest("deploy/operator/base/service.yaml");
    let ports = service.spec.and_then(|s| s.ports).unwrap_or_default();
    let link = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("link"))
        .expect("deploy/operator/base/service.yaml: a port `link`");
    assert_eq!(link.port, 10000);
    assert_eq!(port, link.port.to_string(), "PERENNIAL_CLOUD_URL names the link Service's port: {url}");
    let name = service.metadata.name.expect("the Service has a name");
    let in_cluster = format!("{name}.{OPERATOR_NAMESPACE}.svc");
    assert!(host == in_cluster || host.starts_with(&format!("{in_cluster}.")), "{url} names the Service {in_cluster}");
}

// ---- install.sh ----

/// ELF's e_machine numbers of the builds a node may be given.
const EM_386: u16 = 3;
const EM_ARM: u16 = 40;
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

/// A stand-in for a build of perennial: a real ELF header (what install.sh reads: the magic,
/// the class and byte order, e_machine), then `tag` (which tells builds apart).
fn elf(machine: u16, tag: &str) -> Vec<u8> {
    let mut file = vec![0u8; 64];
    file[..4].copy_from_slice(b"\x7fELF");
    file[4] = if matches!(machine, EM_386 | EM_ARM) { 1 } else { 2 }; // 32 or 64-bit
    file[5] = 1; // little-endian
    file[6] = 1; // ELF version 1
    file[16..18].copy_from_slice(&2u16.to_le_bytes()); // an executable
    file[18..20].copy_from_slice(&machine.to_le_bytes());
    file[20..24].copy_from_slice(&1u32.to_le_bytes());
    file.extend_from_slice(tag.as_bytes());
    file
}

/// A node installed under a scratch root, from scratch inputs. An x86_64 node unless
/// [`Node::on`] says otherwise (install.sh reads `PERENNIAL_INSTALL_MACHINE` for `uname -m`).
pub struct Node {
    pub root: TempDir,
    inputs: TempDir,
    machine: &'static str,
}

impl Node {
    fn new() -> Node {
        let inputs = TempDir::new().expect("a scratch folder");
        for (name, bytes) in [
            ("perennial", elf(EM_X86_64, "a stand-in for perennial")),
            ("node.token", b"a-node-token\n".to_vec()),
            ("ca.pem", b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec()),
            ("empty.token", Vec::new()),
            ("a-script", b"#!/bin/sh\necho not a build of perennial\n".to_vec()),
        ] {
            std::fs::write(inputs.path().join(name), bytes).expect("write an input");
        }
        Node { root: TempDir::new().expect("a scratch root"), inputs, machine: "x86_64" }
    }

    /// A node whose `uname -m` is `machine`.
    fn on(machine: &'static str) -> Node {
        Node { machine, ..Node::new() }
    }

    fn input(&self, name: &str) -> String {
        self.inputs.path().join(name).display().to_string()
    }

    /// Writes an input file (or a folder's file: `builds/perennial-aarch64`).
    fn write_input(&self, name: &str, bytes: &[u8]) -> String {
        let path = self.inputs.path().join(name);
        std::fs::create_dir_all(path.parent().expect("under the inputs")).expect("an input folder");
        std::fs::write(&path, bytes).expect("write an input");
        path.display().to_string()
    }

    /// The options of an install that succeeds, with `--binary` set to `binary`.
    fn options_with_binary(&self, binary: &str) -> Vec<String> {
        let mut options = self.options();
        let index = options.iter().position(|o| o == "--binary").expect("--binary") + 1;
        options[index] = binary.to_owned();
        options
    }

    /// The options of an install that succeeds.
    fn options(&self) -> Vec<String> {
        [
            ("--binary", self.input("perennial")),
            ("--cloud-url", "wss://link.example.com:10000/v1/link".to_owned()),
            ("--token-file", self.input("node.token")),
            ("--ca-file", self.input("ca.pem")),
            ("--node-name", "n1".to_owned()),
        ]
        .into_iter()
        .flat_map(|(option, value)| [option.to_owned(), value])
        .collect()
    }

    /// `sh install.sh OPTIONS` under the scratch root (which skips systemctl).
    fn install(&self, options: &[String]) -> Output {
        Command::new("sh")
            .arg(repo_path("deploy/edge/install.sh"))
            .args(options)
            .env("PERENNIAL_INSTALL_ROOT", self.root.path())
            .env("PERENNIAL_INSTALL_MACHINE", self.machine)
            .output()
            .expect("run sh")
    }

    /// The node's path for an absolute one on the node.
    fn at(&self, path: &str) -> PathBuf {
        self.root.path().join(path.trim_start_matches('/'))
    }
}

/// A node after a successful install.
pub fn installed() -> Node {
    let node = Node::new();
    let output = node.install(&node.options());
    assert!(
        output.status.success(),
        "install.sh failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    node
}

/// `KEY=value` lines.
pub fn env_file(root: &Path) -> BTreeMap<String, String> {
    let path = root.join(ENV_FILE.trim_start_matches('/'));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
    let lines = text.lines().filter(|line| !line.trim().is_empty() && !line.starts_with('#'));
    lines
        .map(|line| {
            let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("edge.env: not KEY=value: {line:?}"));
            (key.to_owned(), value.to_owned())
        })
        .collect()
}

fn mode(path: &Path) -> u32 {
    let meta = std::fs::metadata(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    meta.permissions().mode() & 0o777
}

/// Every file and folder under `root`, relative.
fn contents(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut folders = vec![root.to_owned()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap_or_else(|err| panic!("{}: {err}", folder.display())) {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                folders.push(path.clone());
            }
            out.push(path.strip_prefix(root).expect("under the root").to_owned());
        }
    }
    out
}

fn same_file(a: &Path, b: &Path) -> bool {
    let read = |path: &Path| std::fs::read(path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
    read(a) == read(b)
}

#[test]
fn install_writes_the_env_token_unit_and_binary() {
    let node = installed();
    let env = env_file(node.root.path());
    let get = |key: &str| env.get(key).map(String::as_str);
    assert_eq!(get("PERENNIAL_CLOUD_URL"), Some("wss://link.example.com:10000/v1/link"));
    assert_eq!(get("NODENAME"), Some("n1"));
    assert_eq!(get("BIND_PORT"), Some(BIND_PORT));
    assert_eq!(get("PERENNIAL_TOKEN_FILE"), Some(TOKEN));
    let ca = get("PERENNIAL_CA_FILE").expect("edge.env sets PERENNIAL_CA_FILE");
    assert!(get("PERENNIAL_STATE_DIR").is_some_and(|dir| node.at(dir).is_dir()), "the state folder: {env:?}");

    assert!(same_file(&node.at(TOKEN), Path::new(&node.input("node.token"))), "the token is copied");
    assert_eq!(mode(&node.at(TOKEN)), 0o600, "only root reads the token");
    assert!(same_file(&node.at(ca), Path::new(&node.input("ca.pem"))), "the CA is copied");
    assert!(same_file(&node.at(UNIT), &repo_path("deploy/edge/perennial-edge.service")), "the unit is installed");
    assert!(same_file(&node.at(BINARY), Path::new(&node.input("perennial"))), "the binary is installed");
    assert_eq!(mode(&node.at(BINARY)) & 0o111, 0o111, "the binary is executable");

    // The operator adds settings of their own (a trust key, a log level) ...
    let env_path = node.at(ENV_FILE);
    let mut text = std::fs::read_to_string(&env_path).expect("edge.env").replace("RUST_LOG=info", "RUST_LOG=debug");
    text.push_str("PERENNIAL_TRUST_KEY=/etc/perennial/trust/trust.pub\n");
    std::fs::write(&env_path, text).expect("edge.env");
    // ... then runs it again, an upgrade: the new settings replace the old, theirs stay.
    let mut options = node.options();
    let name = options.iter().position(|o| o == "--node-name").expect("--node-name") + 1;
    options[name] = "n2".to_owned();
    let output = node.install(&options);
    assert!(output.status.success(), "a second install.sh: {}", String::from_utf8_lossy(&output.stderr));
    let env = env_file(node.root.path());
    assert_eq!(env.get("NODENAME").map(String::as_str), Some("n2"));
    assert_eq!(env.get("PERENNIAL_TRUST_KEY").map(String::as_str), Some("/etc/perennial/trust/trust.pub"));
    assert_eq!(env.get("RUST_LOG").map(String::as_str), Some("debug"), "the operator's log level is kept");
    let text = std::fs::read_to_string(&env_path).expect("edge.env");
    for key in ["NODENAME=", "RUST_LOG=", "PERENNIAL_CLOUD_URL="] {
        assert_eq!(text.lines().filter(|l| l.starts_with(key)).count(), 1, "{key} once in edge.env:\n{text}");
    }
}

#[test]
fn install_refuses_bad_input_before_writing_anything() {
    let node = Node::new();
    let good = node.options();
    let set = |option: &str, value: &str| -> Vec<String> {
        let mut options = good.clone();
        match options.iter().position(|o| o == option) {
            Some(index) => options[index + 1] = value.to_owned(),
            None => options.extend([option.to_owned(), value.to_owned()]),
        }
        options
    };
    let without = |option: &str| -> Vec<String> {
        let index = good.iter().position(|o| o == option).expect("a good option");
        good.iter().enumerate().filter(|(i, _)| *i != index && *i != index + 1).map(|(_, o)| o.clone()).collect()
    };
    let mut last_without_value = good.clone();
    last_without_value.push("--bind-port".to_owned());
    let missing = node.input("no-such-file");
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        ("no token file", without("--token-file"), "--token-file"),
        ("an http:// cloud URL", set("--cloud-url", "http://link.example.com:10000/v1/link"), "--cloud-url"),
        ("an empty token file", set("--token-file", &node.input("empty.token")), "--token-file"),
        ("an unknown option", set("--frobnicate", "yes"), "--frobnicate"),
        ("a missing binary", set("--binary", &missing), "--binary"),
        ("a binary that is not ELF", set("--binary", &node.input("a-script")), "--binary"),
        ("a missing CA", set("--ca-file", &missing), "--ca-file"),
        ("an option without its value", last_without_value, "--bind-port"),
        ("a port out of range", set("--bind-port", "70000"), "--bind-port"),
        ("a node name with a space", set("--node-name", "n 1"), "--node-name"),
    ];
    for (what, options, named) in cases {
        let stderr = refused(&node, &options, what);
        assert!(stderr.contains(named), "{what}: the message does not name {named}: {stderr}");
    }
}

/// Runs install.sh, which must refuse and write nothing; its message.
fn refused(node: &Node, options: &[String], what: &str) -> String {
    let output = node.install(options);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{what}: install.sh succeeded");
    let written = contents(node.root.path());
    assert!(written.is_empty(), "{what}: install.sh refused, yet wrote {written:?}");
    stderr
}

#[test]
fn install_refuses_a_build_for_another_machine_before_writing_anything() {
    // (the node's `uname -m`, the build's e_machine, what install.sh calls the build's machine)
    let cases = [
        ("aarch64", EM_X86_64, "x86_64"),
        ("x86_64", EM_AARCH64, "aarch64"),
        ("arm64", EM_ARM, "arm"),
        ("armv7l", EM_AARCH64, "aarch64"),
        ("x86_64", EM_386, "i386"),
        ("riscv64", EM_X86_64, "x86_64"),
    ];
    for (machine, built_for, name) in cases {
        let node = Node::on(machine);
        let binary = node.write_input("perennial", &elf(built_for, "another machine's build"));
        let what = format!("a build for {name} on an {machine} node");
        let stderr = refused(&node, &node.options_with_binary(&binary), &what);
        let said = format!("--binary {binary} is built for {name}, this node is {machine}");
        assert!(stderr.contains(&said), "{what}: the message does not say {said:?}: {stderr}");
    }
}

#[test]
fn install_takes_this_nodes_build_from_a_folder_of_builds() {
    for (machine, build) in
        [("x86_64", "x86_64"), ("aarch64", "aarch64"), ("arm64", "aarch64"), ("armv7l", "armv7"), ("armv8l", "armv7")]
    {
        let node = Node::on(machine);
        for (name, em) in [("x86_64", EM_X86_64), ("aarch64", EM_AARCH64), ("armv7", EM_ARM)] {
            node.write_input(&format!("builds/perennial-{name}"), &elf(em, &format!("the {name} build")));
        }
        let output = node.install(&node.options_with_binary(&node.input("builds")));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "--binary builds/ on an {machine} node: {stderr}");
        let expected = node.input(&format!("builds/perennial-{build}"));
        assert!(same_file(&node.at(BINARY), Path::new(&expected)), "an {machine} node gets perennial-{build}");
        assert_eq!(mode(&node.at(BINARY)) & 0o111, 0o111, "the binary is executable");
    }
}

#[test]
fn install_refuses_a_folder_without_this_nodes_build_and_says_what_it_has() {
    let node = Node::on("aarch64");
    node.write_input("builds/perennial-x86_64", &elf(EM_X86_64, "the x86_64 build"));
    node.write_input("builds/perennial-armv7", &elf(EM_ARM, "the armv7 build"));
    let stderr = refused(&node, &node.options_with_binary(&node.input("builds")), "no perennial-aarch64");
    for named in ["perennial-aarch64", "aarch64", "perennial-x86_64", "perennial-armv7"] {
        assert!(stderr.contains(named), "the message does not name {named}: {stderr}");
    }

    // A build under this node's name that is another machine's is refused all the same.
    node.write_input("builds/perennial-aarch64", &elf(EM_X86_64, "misnamed"));
    let stderr = refused(&node, &node.options_with_binary(&node.input("builds")), "a misnamed build");
    assert!(stderr.contains("is built for x86_64, this node is aarch64"), "a misnamed build: {stderr}");

    // The armv7 build does not run on ARMv6 (Raspberry Pi 1 and Zero): a folder has none for it.
    let node = Node::on("armv6l");
    node.write_input("builds/perennial-armv7", &elf(EM_ARM, "the armv7 build"));
    let stderr = refused(&node, &node.options_with_binary(&node.input("builds")), "an ARMv6 node");
    assert!(stderr.contains("armv6l"), "the message names the node's machine: {stderr}");
}

#[test]
fn install_takes_a_real_build_for_its_machine_and_refuses_it_elsewhere() {
    // This test's own executable: a real ELF file, built for the machine the tests run on.
    let (machine, other) = match std::env::consts::ARCH {
        "x86_64" => ("x86_64", "aarch64"),
        "aarch64" => ("aarch64", "x86_64"),
        "arm" => ("armv7l", "x86_64"),
        arch => {
            eprintln!("skipped: no `uname -m` known for {arch}");
            return;
        }
    };
    let exe = std::env::current_exe().expect("the test's executable");
    let exe = exe.display().to_string();
    let node = Node::on(machine);
    let output = node.install(&node.options_with_binary(&exe));
    assert!(output.status.success(), "{exe} on an {machine} node: {}", String::from_utf8_lossy(&output.stderr));
    assert!(same_file(&node.at(BINARY), Path::new(&exe)), "the real build is installed");
    let node = Node::on(other);
    let stderr = refused(&node, &node.options_with_binary(&exe), "a real build on another machine");
    assert!(stderr.contains(&format!("this node is {other}")), "{stderr}");
}

// ---- The systemd unit ----

/// `[Section]` and `Key=value` lines: (section, key) -> the values, in order.
fn unit_entries(text: &str) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<_, Vec<_>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("the unit: not Key=value: {line:?}"));
        out.entry((section.clone(), key.trim().to_owned())).or_default().push(value.trim().to_owned());
    }
    out
}

#[test]
fn unit_runs_the_installed_agent_with_its_env_and_restarts_it() {
    let entries = unit_entries(&read_text("deploy/edge/perennial-edge.service"));
    let get = |section: &str, key: &str| -> Vec<&str> {
        entries.get(&(section.to_owned(), key.to_owned())).into_iter().flatten().map(String::as_str).collect()
    };
    let exec = get("Service", "ExecStart");
    assert_eq!(exec.len(), 1, "one ExecStart: {exec:?}");
    assert_eq!(exec[0].split_whitespace().collect::<Vec<_>>(), [BINARY, "edge"], "ExecStart");
    assert_eq!(get("Service", "EnvironmentFile"), [ENV_FILE], "EnvironmentFile (required: no `-`)");
    assert_eq!(get("Service", "Restart"), ["always"]);
    assert_eq!(get("Install", "WantedBy"), ["multi-user.target"], "started at boot");
    verify_with_systemd();
}

/// `systemd-analyze verify`, on the unit as install.sh installs it, when systemd-analyze is here
/// (250 or newer, for `--recursive-errors`).
fn verify_with_systemd() {
    let version = match Command::new("systemd-analyze").arg("--version").output() {
        Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned(),
        Err(err) if err.kind() == ErrorKind::NotFound => {
            eprintln!("skipped: systemd-analyze is not installed (the unit is not verified)");
            return;
        }
        Err(err) => panic!("run systemd-analyze: {err}"),
    };
    let number = version.split_whitespace().nth(1).and_then(|v| v.parse::<u32>().ok());
    if number.is_none_or(|n| n < 250) {
        eprintln!("skipped: systemd-analyze older than 250 ({version:?}): the unit is not verified");
        return;
    }
    let node = installed();
    let root = format!("--root={}", node.root.path().display());
    let output = Command::new("systemd-analyze")
        .args(["verify", "--recursive-errors=no", "--man=no", &root])
        .arg(node.at(UNIT))
        .output()
        .expect("run systemd-analyze");
    assert!(
        output.status.success() && output.stderr.is_empty(),
        "systemd-analyze verify perennial-edge.service ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every path the agent is given is on a volume (its root filesystem is read-only), in both
/// DaemonSets.
#[test]
fn every_path_the_agent_is_given_is_on_a_volume() {
    for (folder, daemonset) in [("deploy/edge", daemonset()), ("deploy/edge-trusting", trusting_daemonset())] {
        let Some(daemonset) = daemonset else { return };
        let unmounted = crate::paths_on_no_volume(pod_spec(daemonset), agent(daemonset));
        assert!(unmounted.is_empty(), "{folder}: on no volume: {unmounted:?}");
    }
}

/// deploy/edge compiles on the node: its memory limit fits a Python policy's compile (~550 MiB).
/// deploy/edge-trusting runs what the operator signed: the key from its Secret, and the memory of
/// a node that compiles nothing; the rest as deploy/edge.
#[test]
fn the_trusting_agents_take_the_key_from_its_secret_and_compile_nothing() {
    let (Some(compiling), Some(trusting)) = (daemonset(), trusting_daemonset()) else { return };
    let limit = |daemonset: &DaemonSet| {
        let limits = agent(daemonset).resources.as_ref().and_then(|r| r.limits.as_ref());
        crate::bytes(&limits.and_then(|l| l.get("memory")).expect("a memory limit").0)
    };
    assert!(limit(compiling) >= 1 << 30, "deploy/edge compiles on the node: {} bytes", limit(compiling));
    assert!(limit(trusting) <= 256 << 20, "deploy/edge-trusting compiles nothing: {} bytes", limit(trusting));

    let key = env_value(agent(trusting), "PERENNIAL_TRUST_KEY");
    let (mount, volume) = mount_of(trusting, key);
    assert_eq!(mount.read_only, Some(true), "PERENNIAL_TRUST_KEY: mounted read only");
    let secret = volume.secret.as_ref().and_then(|s| s.secret_name.as_deref());
    assert_eq!(secret, Some("perennial-policy-trust"), "PERENNIAL_TRUST_KEY: from its Secret");
    assert!(!env(agent(compiling)).contains_key("PERENNIAL_TRUST_KEY"), "deploy/edge trusts no key");
    let mut plain = env(agent(compiling));
    plain.insert("PERENNIAL_TRUST_KEY", env(agent(trusting))["PERENNIAL_TRUST_KEY"]);
    assert_eq!(env(agent(trusting)), plain, "deploy/edge-trusting's env: deploy/edge's and the key");
}
