//! `deploy/operator/` as `kubectl apply -k` would install it: rendered by the real
//! `kubectl kustomize`, read back as Kubernetes' own types (a misspelt field fails), and checked
//! for what a user relies on: the namespace, the Deployment's replicas, probes, env and security,
//! the Service's ports, least-privilege RBAC bound to the Deployment's ServiceAccount. (That the
//! CRDs are the ones the types generate, and that the operator reads the env the Deployment
//! sets, is checked beside the binary: tests/cli/deploy_env.rs.)
//!
//! Without `kubectl` the tests skip, except under CI (`CI` set), where they fail.

use std::any::TypeId;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::{NamespaceResourceScope, Resource};
#[cfg(test)]
use k8s_openapi::{api::rbac::v1::Subject, apimachinery::pkg::util::intstr::IntOrString};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

const NAMESPACE: &str = "perennial-system";
const IMAGE: &str = "ghcr.io/perennial-edge/perennial:0.1.0";
pub const LABELS: [(&str, &str); 1] = [("app.kubernetes.io/part-of", "perennial")];

/// What the operator calls on the jobs, in each namespace it watches: (API group, resource,
/// verbs). tests/cluster/rbac.rs proves each is used. No Secrets: those are granted per
/// namespace ([`CREDENTIAL_GRANTS`]).
pub const JOB_GRANTS: &[(&str, &str, &[&str])] = &[
    ("sedna.io", "lifelonglearningjobs", &["get", "list", "watch", "patch"]),
    ("sedna.io", "lifelonglearningjobs/status", &["patch"]),
    ("sedna.io", "lifelonglearningjobs/finalizers", &["update"]),
    ("sedna.io", "datasets", &["list", "watch"]),
    ("sedna.io", "datasets/status", &["patch"]),
    ("", "pods", &["list", "watch", "create", "delete", "deletecollection"]),
    ("events.k8s.io", "events", &["create", "patch"]),
];

/// The edge agents' tokens, reviewed: the one grant that is cluster wide in both installs.
pub const REVIEW_GRANTS: &[(&str, &str, &[&str])] = &[("authentication.k8s.io", "tokenreviews", &["create"])];

/// A job's credentialName Secret, in its own namespace.
pub const CREDENTIAL_GRANTS: &[(&str, &str, &[&str])] = &[("", "secrets", &["get"])];

/// Leader election, in the operator's namespace only: the Lease,
/// and the leader's label on its own pod (and off a former leader's), which the Service selects.
pub const LEADER_GRANTS: &[(&str, &str, &[&str])] =
    &[("coordination.k8s.io", "leases", &["get", "create", "update"]), ("", "pods", &["list", "patch"])];

/// Where an object came from, for messages and the namespace check.
struct Meta {
    kind: &'static str,
    name: String,
    namespace: Option<String>,
    labels: BTreeMap<String, String>,
    namespaced: bool,
}

impl Meta {
    fn id(&self) -> String {
        format!("{} {}", self.kind, self.name)
    }
}

#[derive(Default)]
pub struct Rendered {
    all: Vec<Meta>,
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    deployments: Vec<Deployment>,
    services: Vec<Service>,
    pub crds: Vec<CustomResourceDefinition>,
}

/// `kubectl kustomize deploy/operator` (the cluster-wide install), read once; `None` when
/// kubectl is missing outside CI.
pub fn rendered() -> Option<&'static Rendered> {
    static RENDERED: OnceLock<Option<Rendered>> = OnceLock::new();
    RENDERED.get_or_init(|| crate::kustomize("deploy/operator").map(|text| read(&text))).as_ref()
}

/// `kubectl kustomize deploy/operator-namespaced`, read once.
pub fn rendered_namespaced() -> Option<&'static Rendered> {
    static RENDERED: OnceLock<Option<Rendered>> = OnceLock::new();
    RENDERED.get_or_init(|| crate::kustomize("deploy/operator-namespaced").map(|text| read(&text))).as_ref()
}

/// `kubectl kustomize deploy/operator-compiling` (the cluster-wide install compiling for the
/// nodes), read once.
pub fn rendered_compiling() -> Option<&'static Rendered> {
    static RENDERED: OnceLock<Option<Rendered>> = OnceLock::new();
    RENDERED.get_or_init(|| crate::kustomize("deploy/operator-compiling").map(|text| read(&text))).as_ref()
}

/// `kubectl kustomize deploy/operator-namespaced/watched`, read once.
fn rendered_watched() -> Option<&'static Rendered> {
    static RENDERED: OnceLock<Option<Rendered>> = OnceLock::new();
    RENDERED.get_or_init(|| crate::kustomize("deploy/operator-namespaced/watched").map(|text| read(&text))).as_ref()
}

/// Splits the documents and reads each as its Kubernetes type.
fn read(text: &str) -> Rendered {
    let mut out = Rendered::default();
    for (index, value) in crate::documents(text).into_iter().enumerate() {
        let api_version = value["apiVersion"].as_str().unwrap_or_default().to_owned();
        let kind = value["kind"].as_str().unwrap_or_default().to_owned();
        match (api_version.as_str(), kind.as_str()) {
            ("v1", "Namespace") => out.namespaces.push(typed(&value, &mut out.all)),
            ("v1", "ServiceAccount") => out.service_accounts.push(typed(&value, &mut out.all)),
            ("v1", "Service") => out.services.push(typed(&value, &mut out.all)),
            ("apps/v1", "Deployment") => out.deployments.push(typed(&value, &mut out.all)),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => out.cluster_roles.push(typed(&value, &mut out.all)),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                out.cluster_role_bindings.push(typed(&value, &mut out.all))
            }
            ("rbac.authorization.k8s.io/v1", "Role") => out.roles.push(typed(&value, &mut out.all)),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => out.role_bindings.push(typed(&value, &mut out.all)),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => out.crds.push(typed(&value, &mut out.all)),
            _ => panic!("document {}: unexpected {api_version} {kind} {}", index + 1, value["metadata"]["name"]),
        }
    }
    out
}

/// Reads `value` as `K` and checks that nothing was lost on the way: k8s-openapi drops the
/// fields it does not know, so a misspelt field shows up as a difference.
fn typed<K>(value: &Value, all: &mut Vec<Meta>) -> K
where
    K: Resource + DeserializeOwned + Serialize,
    K::Scope: 'static,
{
    let name = value["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let id = format!("{} {name}", K::KIND);
    let object: K = crate::typed::typed(value, &id);
    let labels = value["metadata"]["labels"]
        .as_object()
        .map(|labels| labels.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())).collect())
        .unwrap_or_default();
    all.push(Meta {
        kind: K::KIND,
        name,
        namespace: value["metadata"]["namespace"].as_str().map(str::to_owned),
        labels,
        namespaced: TypeId::of::<K::Scope>() == TypeId::of::<NamespaceResourceScope>(),
    });
    object
}

fn only<'a, T>(items: &'a [T], what: &str) -> &'a T {
    assert_eq!(items.len(), 1, "expected one {what}, found {}", items.len());
    &items[0]
}

pub fn deployment(rendered: &Rendered) -> &Deployment {
    only(&rendered.deployments, "Deployment")
}

fn pod_spec(deployment: &Deployment) -> &PodSpec {
    deployment.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("the Deployment has a pod spec")
}

/// The container that runs `perennial operator`.
pub fn operator_container(deployment: &Deployment) -> &Container {
    let containers = &pod_spec(deployment).containers;
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// Each named container port: name -> number.
fn named_ports(container: &Container) -> BTreeMap<String, i32> {
    container.ports.iter().flatten().filter_map(|p| Some((p.name.clone()?, p.container_port))).collect()
}

pub fn env(container: &Container) -> BTreeMap<String, &k8s_openapi::api::core::v1::EnvVar> {
    container.env.iter().flatten().map(|var| (var.name.clone(), var)).collect()
}

fn grants(rules: &[PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in rules {
        assert!(rule.non_resource_urls.is_none() && rule.resource_names.is_none(), "{rule:?}");
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    assert!(
                        !group.contains('*') && !resource.contains('*') && !verb.contains('*'),
                        "a wildcard grant: ({group:?}, {resource:?}, {verb:?})"
                    );
                    out.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    out
}

fn table(grants: &[(&str, &str, &[&str])]) -> BTreeSet<(String, String, String)> {
    grants
        .iter()
        .flat_map(|(group, resource, verbs)| {
            verbs.iter().map(|verb| (group.to_string(), resource.to_string(), verb.to_string()))
        })
        .collect()
}

fn assert_grants(what: &str, rules: &[PolicyRule], expected: &[(&str, &str, &[&str])]) {
    let granted = grants(rules);
    let wanted = table(expected);
    let missing: Vec<_> = wanted.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&wanted).collect();
    assert!(missing.is_empty(), "{what} lacks what the operator calls: {missing:?}");
    assert!(extra.is_empty(), "{what} grants more than the operator calls (least privilege): {extra:?}");
}

#[test]
fn objects_are_the_expected_ones_in_the_operator_namespace() {
    let Some(cluster_wide) = rendered() else { return };
    let namespaced = rendered_namespaced().expect("rendered like deploy/operator");
    for (rendered, cluster_role) in
        [(cluster_wide, "perennial-operator"), (namespaced, "perennial-operator-tokenreviews")]
    {
        objects_are_the_expected_ones(rendered, cluster_role);
    }
}

fn objects_are_the_expected_ones(rendered: &Rendered, cluster_role: &str) {
    let ids: BTreeSet<_> = rendered.all.iter().map(Meta::id).collect();
    for id in [
        "Namespace perennial-system",
        "ServiceAccount perennial-operator",
        &format!("ClusterRole {cluster_role}"),
        &format!("ClusterRoleBinding {cluster_role}"),
        "Deployment perennial-operator",
        "Service perennial-operator",
        "CustomResourceDefinition lifelonglearningjobs.sedna.io",
        "CustomResourceDefinition datasets.sedna.io",
    ] {
        assert!(ids.contains(id), "{id} is not installed: {ids:?}");
    }
    assert_eq!(rendered.roles.len(), 1, "one Role (leader election)");
    assert_eq!(rendered.role_bindings.len(), 1, "one RoleBinding (leader election)");
    assert_eq!(ids.len(), rendered.all.len(), "an object twice: {ids:?}");
    for meta in &rendered.all {
        if meta.namespaced {
            assert_eq!(meta.namespace.as_deref(), Some(NAMESPACE), "{}", meta.id());
        } else {
            assert_eq!(meta.namespace, None, "{} is cluster-scoped", meta.id());
        }
        for (key, value) in LABELS {
            assert_eq!(meta.labels.get(key).map(String::as_str), Some(value), "{}: label {key}", meta.id());
        }
    }
    // kustomize puts the Namespace and the CRDs first, so that `kubectl apply -k` can create
    // the rest in one go.
    assert_eq!(rendered.all[0].kind, "Namespace");
}

#[test]
fn deployment_runs_two_safe_replicas() {
    let Some(rendered) = rendered() else { return };
    let deployment = deployment(rendered);
    let spec = deployment.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let template_labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    for (key, value) in spec.selector.match_labels.iter().flatten() {
        assert_eq!(template_labels.get(key), Some(value), "the selector selects the pod template: {key}");
    }
    let pod = pod_spec(deployment);
    assert_eq!(pod.termination_grace_period_seconds, Some(30));
    let container = operator_container(deployment);
    assert_eq!(container.image.as_deref(), Some(IMAGE));
    assert_eq!(container.command, Some(vec!["perennial".to_owned(), "operator".to_owned()]));

    // Alive on /healthz, ready on /readyz (leader or standby: both roll out), both at the named
    // port `metrics`.
    let ports = named_ports(container);
    assert!(ports.contains_key("metrics") && ports.contains_key("link"), "{ports:?}");
    for (which, probe, path) in
        [("liveness", &container.liveness_probe, "/healthz"), ("readiness", &container.readiness_probe, "/readyz")]
    {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap_or_else(|| panic!("no {which} probe"));
        assert_eq!(get.path.as_deref(), Some(path), "{which}");
        assert_eq!(get.port, IntOrString::String("metrics".into()), "{which}");
    }

    // The env: the pod's identity from the downward API, addresses on the container's ports,
    // and the image of the worker pods' init containers: this one.
    let env = env(container);
    for (name, field) in [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")] {
        let from = env.get(name).and_then(|v| v.value_from.as_ref()).and_then(|v| v.field_ref.as_ref());
        assert_eq!(from.map(|f| f.field_path.as_str()), Some(field), "{name}");
    }
    let metrics = env.get("PERENNIAL_METRICS_ADDR").and_then(|v| v.value.clone()).expect("PERENNIAL_METRICS_ADDR");
    assert_eq!(metrics, format!("0.0.0.0:{}", ports["metrics"]), "metrics listen on the container port `metrics`");
    assert_eq!(env.get("PERENNIAL_IMAGE").and_then(|v| v.value.as_deref()), container.image.as_deref());
    // The link listens on the container port `link`, with the certificate of a mounted TLS Secret.
    let link = env.get("PERENNIAL_LINK_ADDR").and_then(|v| v.value.clone()).expect("PERENNIAL_LINK_ADDR");
    assert_eq!(link, format!("0.0.0.0:{}", ports["link"]));
    let mounts: BTreeMap<String, String> =
        container.volume_mounts.iter().flatten().map(|m| (m.mount_path.clone(), m.name.clone())).collect();
    for (name, file) in [("PERENNIAL_LINK_CERT", "tls.crt"), ("PERENNIAL_LINK_KEY", "tls.key")] {
        let path = env.get(name).and_then(|v| v.value.clone()).unwrap_or_else(|| panic!("{name}"));
        let (folder, found) = path.rsplit_once('/').expect("a path");
        assert_eq!(found, file, "{name}");
        let volume = pod.volumes.iter().flatten().find(|v| Some(&v.name) == mounts.get(folder)).expect("mounted");
        let secret = volume.secret.as_ref().and_then(|s| s.secret_name.as_deref());
        assert_eq!(secret, Some("perennial-link-tls"), "{name} comes from the link's TLS Secret");
    }

    // Non-root, read-only, no privilege, no capabilities, the runtime's seccomp profile.
    let pod_security = pod.security_context.clone().unwrap_or_default();
    let security = container.security_context.clone().unwrap_or_default();
    assert_eq!(security.run_as_non_root.or(pod_security.run_as_non_root), Some(true), "runAsNonRoot");
    let user = security.run_as_user.or(pod_security.run_as_user);
    assert!(user.is_some_and(|uid| uid != 0), "a numeric non-root user (the kubelet cannot check a name): {user:?}");
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    let drop = security.capabilities.and_then(|c| c.drop).unwrap_or_default();
    assert_eq!(drop, ["ALL"]);
    let seccomp = security.seccomp_profile.or(pod_security.seccomp_profile).map(|s| s.type_);
    assert_eq!(seccomp.as_deref(), Some("RuntimeDefault"));

    // Small resources, bounded.
    let resources = container.resources.clone().unwrap_or_default();
    for (what, quantities) in [("requests", resources.requests), ("limits", resources.limits)] {
        let quantities = quantities.unwrap_or_default();
        assert!(quantities.contains_key("cpu") && quantities.contains_key("memory"), "{what}: {quantities:?}");
    }

    // The replicas prefer different nodes.
    let spread = pod.affinity.as_ref().and_then(|a| a.pod_anti_affinity.as_ref());
    let preferred = spread.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref());
    let term = &preferred.and_then(|terms| terms.first()).expect("a preferred podAntiAffinity").pod_affinity_term;
    assert_eq!(term.topology_key, "kubernetes.io/hostname");
    let selects = term.label_selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap_or_default();
    assert!(selects.iter().all(|(k, v)| template_labels.get(k) == Some(v)) && !selects.is_empty(), "{selects:?}");
}

#[test]
fn service_targets_the_named_container_ports() {
    let Some(rendered) = rendered() else { return };
    let service = only(&rendered.services, "Service");
    let spec = service.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref().unwrap_or("ClusterIP"), "ClusterIP");
    let deployment = deployment(rendered);
    let template_labels = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let selector = spec.selector.clone().unwrap_or_default();
    assert!(!selector.is_empty(), "the Service selects pods");
    // The operator's pods, and of them the leader's only: it labels its own pod (the template
    // does not have the label, so a new pod never starts as a leader).
    assert_eq!(selector.get("perennial.io/role").map(String::as_str), Some("leader"), "{selector:?}");
    assert!(!template_labels.contains_key("perennial.io/role"), "{template_labels:?}");
    for (key, value) in selector.iter().filter(|(key, _)| *key != "perennial.io/role") {
        assert_eq!(template_labels.get(key), Some(value), "the Service selects the operator's pods: {key}");
    }
    let ports = named_ports(operator_container(deployment));
    let mut exposed = BTreeMap::new();
    for port in spec.ports.iter().flatten() {
        let Some(IntOrString::String(target)) = &port.target_port else {
            panic!("Service port {:?} targets a number, not a named container port", port.name)
        };
        let number = ports.get(target).unwrap_or_else(|| panic!("no container port is named {target}: {ports:?}"));
        exposed.insert(target.clone(), (port.port, *number));
    }
    assert_eq!(exposed.get("link"), Some(&(10000, 10000)), "{exposed:?}");
    assert_eq!(exposed.get("metrics"), Some(&(8080, 8080)), "{exposed:?}");
}

/// The Deployment's ServiceAccount as a binding's subject, after checking it is installed.
#[cfg(test)]
fn deployment_subject(rendered: &Rendered) -> Subject {
    let deployment = deployment(rendered);
    let account = pod_spec(deployment).service_account_name.clone().expect("the Deployment names its ServiceAccount");
    let namespace = deployment.metadata.namespace.clone().unwrap();
    assert!(
        rendered.service_accounts.iter().any(|sa| sa.metadata.name.as_deref() == Some(account.as_str())),
        "the ServiceAccount {account} is installed"
    );
    Subject { kind: "ServiceAccount".into(), name: account, namespace: Some(namespace), api_group: None }
}

fn cluster_role<'a>(rendered: &'a Rendered, name: &str) -> &'a ClusterRole {
    let found = rendered.cluster_roles.iter().find(|role| role.metadata.name.as_deref() == Some(name));
    found.unwrap_or_else(|| panic!("no ClusterRole {name}"))
}

/// Each ClusterRoleBinding binds a ClusterRole of the install to `subject` alone.
#[cfg(test)]
fn assert_bound(rendered: &Rendered, subject: &Subject, bound: &[&str]) {
    let names: Vec<&str> =
        rendered.cluster_role_bindings.iter().map(|binding| binding.role_ref.name.as_str()).collect();
    assert_eq!(names, bound, "the ClusterRoles bound");
    for binding in &rendered.cluster_role_bindings {
        assert_eq!(binding.subjects.as_deref(), Some(std::slice::from_ref(subject)), "ClusterRoleBinding subjects");
        assert_eq!(binding.role_ref.kind, "ClusterRole");
    }
}

/// The leader election Role, in the operator's namespace, bound to `subject`.
#[cfg(test)]
fn assert_leader_role(rendered: &Rendered, subject: &Subject) {
    let role = only(&rendered.roles, "Role");
    assert_grants("the leader election Role", role.rules.as_deref().unwrap_or_default(), LEADER_GRANTS);
    let binding = only(&rendered.role_bindings, "RoleBinding");
    assert_eq!(binding.subjects.as_deref(), Some(std::slice::from_ref(subject)), "RoleBinding subjects");
    assert_eq!(binding.role_ref.kind, "Role");
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    assert_eq!(binding.metadata.namespace, role.metadata.namespace, "the RoleBinding is beside its Role");
}

/// Cluster wide: the jobs' grants and the reviews in one bound ClusterRole; Secrets in another,
/// bound by no one until a namespace's admin binds it there.
#[test]
fn the_cluster_wide_install_is_least_privilege_and_reads_no_secret_unbound() {
    let Some(rendered) = rendered() else { return };
    let subject = deployment_subject(rendered);
    let wanted: Vec<_> = JOB_GRANTS.iter().chain(REVIEW_GRANTS).copied().collect();
    let role = cluster_role(rendered, "perennial-operator");
    assert_grants("the ClusterRole", role.rules.as_deref().unwrap_or_default(), &wanted);
    let credentials = cluster_role(rendered, "perennial-operator-credentials");
    assert_grants("the credentials' ClusterRole", credentials.rules.as_deref().unwrap_or_default(), CREDENTIAL_GRANTS);
    assert_bound(rendered, &subject, &["perennial-operator"]);
    assert_leader_role(rendered, &subject);
}

/// Namespaced: the reviews alone cluster wide; the jobs' grants and Secrets in watched/'s Role,
/// applied per namespace; the Deployment watches the namespaces it names.
#[test]
fn the_namespaced_install_grants_nothing_cluster_wide_but_reviews() {
    let Some(rendered) = rendered_namespaced() else { return };
    let subject = deployment_subject(rendered);
    assert_eq!(rendered.cluster_roles.len(), 1, "one ClusterRole");
    let role = cluster_role(rendered, "perennial-operator-tokenreviews");
    assert_grants("the ClusterRole", role.rules.as_deref().unwrap_or_default(), REVIEW_GRANTS);
    assert_bound(rendered, &subject, &["perennial-operator-tokenreviews"]);
    assert_leader_role(rendered, &subject);
    let env = env(operator_container(deployment(rendered)));
    let watched = env.get("PERENNIAL_NAMESPACE").and_then(|v| v.value.clone()).expect("PERENNIAL_NAMESPACE");
    assert!(!watched.trim().is_empty(), "the namespaces watched");

    let watched = rendered_watched().expect("rendered like the rest");
    assert_eq!(watched.all.len(), 2, "a Role and its RoleBinding");
    for meta in &watched.all {
        assert_eq!(meta.namespace, None, "{}: put in a namespace by `kubectl apply -n`", meta.id());
    }
    let role = only(&watched.roles, "Role");
    let wanted: Vec<_> = JOB_GRANTS.iter().chain(CREDENTIAL_GRANTS).copied().collect();
    assert_grants("watched/'s Role", role.rules.as_deref().unwrap_or_default(), &wanted);
    let binding = only(&watched.role_bindings, "RoleBinding");
    assert_eq!(binding.subjects.as_deref(), Some(std::slice::from_ref(&subject)), "RoleBinding subjects");
    assert_eq!((binding.role_ref.kind.as_str(), Some(&binding.role_ref.name)), ("Role", role.metadata.name.as_ref()));
}

/// Every path the operator is given is on a volume (its root filesystem is read-only), in each
/// install.
#[test]
fn every_path_the_operator_is_given_is_on_a_volume() {
    let installs = [
        ("deploy/operator", rendered()),
        ("deploy/operator-namespaced", rendered_namespaced()),
        ("deploy/operator-compiling", rendered_compiling()),
    ];
    for (folder, rendered) in installs {
        let Some(rendered) = rendered else { return };
        let deployment = deployment(rendered);
        let unmounted = crate::paths_on_no_volume(pod_spec(deployment), operator_container(deployment));
        assert!(unmounted.is_empty(), "{folder}: on no volume: {unmounted:?}");
    }
}

/// deploy/operator-compiling: the operator (not root) can read its signing key and no one else
/// can; the artifacts (~30 MB a Python policy) are on a volume of their own, not the 64 MiB
/// /tmp; the memory limit fits a Python policy's compile (~550 MiB, in a child process); the
/// rest as deploy/operator.
#[test]
fn the_compiling_install_reads_its_key_and_has_room_for_the_compiles() {
    let (Some(plain), Some(compiling)) = (rendered(), rendered_compiling()) else { return };
    let deployment = deployment(compiling);
    let (pod, container) = (pod_spec(deployment), operator_container(deployment));
    let env = env(container);
    let path = |name: &str| env.get(name).and_then(|v| v.value.as_deref()).unwrap_or_else(|| panic!("no {name}"));
    let mounted =
        |name: &str| crate::mount_holding(pod, container, path(name)).unwrap_or_else(|| panic!("{name}: on no volume"));

    let (mount, volume) = mounted("PERENNIAL_SIGN_KEY");
    assert_eq!(mount.read_only, Some(true), "the signing key: mounted read only");
    let secret = volume.secret.as_ref().expect("the signing key: a Secret's file");
    assert_eq!(secret.secret_name.as_deref(), Some("perennial-policy-signing"));
    let mode = secret.default_mode.unwrap_or(0o644);
    let security = pod.security_context.as_ref().expect("a pod security context");
    // A Secret's files are root's, and the fsGroup's when one is set.
    let operator_reads = security.run_as_user == Some(0)
        || mode & 0o040 != 0 && security.fs_group.is_some() && security.fs_group == security.run_as_group;
    assert!(
        operator_reads,
        "the operator (user {:?}) cannot read its key: mode {mode:o}, {security:?}",
        security.run_as_user
    );
    assert_eq!(mode & 0o007, 0, "the signing key is readable by others: mode {mode:o}");

    let (mount, volume) = mounted("PERENNIAL_ARTIFACT_DIR");
    assert_ne!(mount.read_only, Some(true), "the artifacts are written");
    let size = volume.empty_dir.as_ref().and_then(|dir| dir.size_limit.as_ref()).map(|q| crate::bytes(&q.0));
    assert!(volume.name != "tmp" && size >= Some(1 << 30), "the artifacts' volume {}: {size:?} bytes", volume.name);

    let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
    let memory = crate::bytes(&limits.and_then(|l| l.get("memory")).expect("a memory limit").0);
    assert!(memory >= 1 << 30, "the compiles' memory: a limit of {memory} bytes");

    let mut expected = super::operator::env(operator_container(super::operator::deployment(plain)));
    for name in ["PERENNIAL_SIGN_KEY", "PERENNIAL_ARTIFACT_DIR"] {
        expected.insert(name.to_owned(), env[name]);
    }
    assert_eq!(env, expected, "deploy/operator-compiling's env: deploy/operator's and the compiles'");
}
