//! The operator's RBAC is least privilege, proven on the real API server from its audit log
//! (`scripts/test` starts kube-apiserver with tests/cluster/audit-policy.yaml and the
//! OwnerReferencesPermissionEnforcement admission plugin). The operator runs as its
//! ServiceAccount with the RBAC that deploy/ installs, through a whole round (a linked edge agent
//! proving its node with its pod's token, a job naming its Secret, an event repeated, the job
//! deleted); then (a) every rule bound to the ServiceAccount was used by one of its requests,
//! (b) none of its requests was refused, and (c) what it must not do is not allowed. For the
//! cluster-wide install (deploy/operator) and the namespaced one (deploy/operator-namespaced,
//! watching two namespaces).

use std::path::PathBuf;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use crate::harness::{Cluster, cluster, free_port, until};
use crate::stack::{DATASET, JOB, Kubelet, World};

const SYSTEM: &str = "perennial-system";
const EDGE: &str = "perennial-edge";
/// The cluster-wide install's ServiceAccount, as the API server names its user.
const OPERATOR: &str = "system:serviceaccount:perennial-system:perennial-operator";

/// The API server's audit log: `PERENNIAL_TEST_AUDIT_LOG`, or `audit.log` beside the kubeconfig
/// (`../shared/k8s/up --state DIR` writes it there when started with the flags below). Without
/// it the test fails: least privilege unproven must not look green.
fn audit_log(cluster: &Cluster) -> PathBuf {
    let path = std::env::var_os("PERENNIAL_TEST_AUDIT_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|| cluster.kubeconfig.with_file_name("audit.log"));
    assert!(
        path.is_file(),
        "no audit log at {}: this test reads the API server's. Run the tests with `scripts/test`, which starts the API server \
         with tests/cluster/audit-policy.yaml, an audit log and the OwnerReferencesPermissionEnforcement \
         admission plugin; with a cluster of your own, start it so and set PERENNIAL_TEST_AUDIT_LOG",
        path.display()
    );
    path
}

/// One request of the audit log.
#[derive(Debug)]
struct Request {
    verb: String,
    group: String,
    /// `pods`, or `pods/status` for a subresource.
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    code: u64,
}

impl Request {
    fn refused(&self) -> bool {
        self.code == 401 || self.code == 403
    }
}

/// The requests `user` made since `since` (each once: the stage that answered it).
fn requests(cluster: &Cluster, user: &str, since: Timestamp) -> Vec<Request> {
    let text = std::fs::read_to_string(audit_log(cluster)).expect("read the audit log");
    let mut out = Vec::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else { continue };
        // A watch is logged when it starts (ResponseStarted); other requests when answered.
        let stage = event["stage"].as_str().unwrap_or_default();
        if event["user"]["username"] != user || !matches!(stage, "ResponseStarted" | "ResponseComplete") {
            continue;
        }
        let at = event["requestReceivedTimestamp"].as_str().and_then(|t| t.parse::<Timestamp>().ok());
        if at.is_none_or(|at| at < since) {
            continue;
        }
        let target = &event["objectRef"];
        let mut resource = target["resource"].as_str().unwrap_or_default().to_owned();
        if let Some(sub) = target["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        out.push(Request {
            verb: event["verb"].as_str().unwrap_or_default().to_owned(),
            group: target["apiGroup"].as_str().unwrap_or_default().to_owned(),
            resource,
            namespace: target["namespace"].as_str().map(str::to_owned),
            name: target["name"].as_str().map(str::to_owned),
            code: event["responseStatus"]["code"].as_u64().unwrap_or(0),
        });
    }
    out
}

/// One verb on one resource that a binding grants, in a namespace (a RoleBinding's) or all.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    namespace: Option<String>,
    group: String,
    resource: String,
    verb: String,
    names: Vec<String>,
}

fn grants_of(rules: &[PolicyRule], namespace: Option<&str>) -> Vec<Grant> {
    let mut out = Vec::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.push(Grant {
                        namespace: namespace.map(str::to_owned),
                        group: group.clone(),
                        resource: resource.clone(),
                        verb: verb.clone(),
                        names: rule.resource_names.clone().unwrap_or_default(),
                    });
                }
            }
        }
    }
    out
}

/// Everything bound to ServiceAccount `namespace/name`: by ClusterRoleBindings, and by the
/// RoleBindings of `namespaces`, as the API server holds them.
async fn bound(client: &kube::Client, (namespace, name): (&str, &str), namespaces: &[&str]) -> Vec<Grant> {
    let is_it = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects
            .iter()
            .flatten()
            .any(|s| s.kind == "ServiceAccount" && s.name == name && s.namespace.as_deref() == Some(namespace))
    };
    let cluster_roles: Api<ClusterRole> = Api::all(client.clone());
    let mut out = Vec::new();
    let bindings = Api::<ClusterRoleBinding>::all(client.clone()).list(&ListParams::default()).await.expect("list");
    for binding in bindings.items.into_iter().filter(|b| is_it(&b.subjects)) {
        let role = cluster_roles.get(&binding.role_ref.name).await.expect("the bound ClusterRole");
        out.extend(grants_of(role.rules.as_deref().unwrap_or_default(), None));
    }
    for scope in namespaces {
        let roles: Api<Role> = Api::namespaced(client.clone(), scope);
        let bindings = Api::<RoleBinding>::namespaced(client.clone(), scope).list(&ListParams::default()).await;
        for binding in bindings.expect("list").items.into_iter().filter(|b| is_it(&b.subjects)) {
            let rules = match binding.role_ref.kind.as_str() {
                "Role" => roles.get(&binding.role_ref.name).await.expect("the bound Role").rules,
                _ => cluster_roles.get(&binding.role_ref.name).await.expect("the bound ClusterRole").rules,
            };
            out.extend(grants_of(rules.as_deref().unwrap_or_default(), Some(scope)));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Whether an accepted request used `grant`.
fn used(grant: &Grant, requests: &[Request]) -> bool {
    requests.iter().any(|r| {
        !r.refused()
            && r.verb == grant.verb
            && r.group == grant.group
            && r.resource == grant.resource
            && (grant.namespace.is_none() || r.namespace == grant.namespace)
            && (grant.names.is_empty() || r.name.as_ref().is_some_and(|n| grant.names.contains(n)))
    })
}

/// A grant no request shows, and why that is right: update on the jobs' finalizers is checked
/// by an admission plugin at each pod creation, not requested (proven needed by
/// [`owner_references_need_the_finalizers_grant`]); a job is read again (get) only after a
/// status conflict, which a round may not meet.
fn not_a_request(grant: &Grant) -> bool {
    (grant.resource == "lifelonglearningjobs/finalizers" && grant.verb == "update")
        || (grant.resource == "lifelonglearningjobs" && grant.verb == "get")
}

/// Waits for the leader to renew its Lease once (every 5 s): a round quicker than that would
/// leave the `update` on leases unused.
async fn leader_renewed(cluster: &Cluster, since: Timestamp) {
    until("the operator renews its leader Lease", Duration::from_secs(30), || {
        let renewed = requests(cluster, OPERATOR, since).iter().any(|r| r.resource == "leases" && r.verb == "update");
        async move { renewed.then_some(()) }
    })
    .await;
}

/// (a) and (b): every grant used, no request refused.
fn assert_least_privilege(user: &str, grants: &[Grant], requests: &[Request]) {
    assert!(!grants.is_empty(), "nothing is bound to {user}");
    let refused: Vec<&Request> = requests.iter().filter(|r| r.refused()).collect();
    assert!(refused.is_empty(), "{user} was refused: {refused:#?}");
    let unused: Vec<&Grant> = grants.iter().filter(|g| !not_a_request(g) && !used(g, requests)).collect();
    assert!(unused.is_empty(), "{user} is granted what it did not use (least privilege): {unused:#?}");
}

/// `kubectl auth can-i ARGS --as=USER`: yes or no.
fn can(cluster: &Cluster, user: &str, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend(args);
    let as_user = format!("--as={user}");
    all.push(&as_user);
    let output = cluster.kubectl(&all);
    let answer = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    match answer.as_str() {
        "yes" => true,
        "no" => false,
        _ => panic!("kubectl {}: {answer} {}", all.join(" "), String::from_utf8_lossy(&output.stderr)),
    }
}

/// Each `(args, allowed)` answered so for `user`.
fn assert_can(cluster: &Cluster, user: &str, cases: &[(&[&str], bool)]) {
    let wrong: Vec<String> = cases
        .iter()
        .filter(|(args, allowed)| can(cluster, user, args) != *allowed)
        .map(|(args, allowed)| format!("{} should be {}", args.join(" "), if *allowed { "yes" } else { "no" }))
        .collect();
    assert!(wrong.is_empty(), "{user}: {wrong:#?}");
}

/// A pod in `namespace` that meets the restricted Pod Security Standard (the operator's
/// namespace enforces it): the operator's own pod, for `--pod-name`.
async fn operator_pod(client: &kube::Client, namespace: &str, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"perennial.io/test": "cluster"}},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "operator", "image": "ghcr.io/perennial-edge/perennial:0.1.0",
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]
        }
    }))
    .expect("a pod");
    Api::<Pod>::namespaced(client.clone(), namespace).create(&PostParams::default(), &pod).await.expect("the pod");
}

/// Applies a JSON object with kubectl (as the admin).
fn apply(cluster: &Cluster, object: &Value, namespace: Option<&str>) {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), serde_json::to_vec(object).expect("json")).expect("write");
    let path = file.path().display().to_string();
    match namespace {
        Some(namespace) => cluster.kubectl_ok(&["apply", "-n", namespace, "-f", &path]),
        None => cluster.kubectl_ok(&["apply", "-f", &path]),
    };
}

/// Waits for a Warning `reason` on the job `name` whose note has `says`; returns the event.
async fn warning(world: &World, name: &str, reason: &str, says: &str) -> Event {
    let events: Api<Event> = Api::namespaced(world.client.clone(), &world.namespace);
    until(&format!("a {reason} event on {name} saying {says:?}"), Duration::from_secs(30), || async {
        let listed = events.list(&ListParams::default()).await.ok()?;
        listed.items.into_iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
                && e.note.as_deref().is_some_and(|note| note.contains(says))
        })
    })
    .await
}

/// A job beside the world's, naming another namespace's Secret: refused by name, on the job's
/// events and its `status.message`, and the Secret never read. Looked at again unchanged, it says so again (a repeated
/// Event: patched into a series).
async fn a_secret_of_another_namespace_is_refused(world: &World, other: &str) {
    let job = json!({"apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob", "metadata": {"name": "stolen"},
        "spec": {"dataset": {"name": DATASET, "trainProb": 0.8},
                 "credentialName": format!("{other}/db-password"),
                 "trainSpec": {"template": {"spec": {"containers": [{"name": "t", "image": "i"}]}},
                               "trigger": {"condition": {"operator": ">=", "threshold": 1, "metric": "num_of_samples"}}},
                 "evalSpec": {"template": {"spec": {"containers": [{"name": "e", "image": "i"}]}}},
                 "deploySpec": {"template": {"spec": {"containers": [{"name": "d", "image": "i"}]}}},
                 "outputDir": world.output}});
    apply(world.cluster, &job, Some(&world.namespace));
    let says = format!("names the Secret \"db-password\" of namespace \"{other}\"");
    let first = warning(world, "stolen", "InvalidSpec", &says).await;
    let note = first.note.clone().unwrap_or_default();
    assert!(note.contains("spec.credentialName"), "the refusal names the field: {note}");
    // And on the job's status.
    let message = until("the refusal in the job's status.message", Duration::from_secs(30), || async {
        let job = world.jobs().get_opt("stolen").await.ok()??;
        job.status?.message.filter(|m| m.starts_with("refused: "))
    })
    .await;
    assert!(message.contains("spec.credentialName") && message.contains(&says), "{message}");
    // Its Dataset changed: the job is looked at again, unchanged, and refused again.
    world.cluster.kubectl_ok(&["annotate", "dataset", DATASET, "-n", &world.namespace, "perennial.io/test=again"]);
    until("the refusal said again (a series)", Duration::from_secs(30), || async {
        let events: Api<Event> = Api::namespaced(world.client.clone(), &world.namespace);
        let again = events.get(first.metadata.name.as_deref()?).await.ok()?;
        again.series.is_some().then_some(())
    })
    .await;
    let pods = world.pods().list(&ListParams::default().labels("lifelonglearningjob.sedna.io/name=stolen")).await;
    assert!(pods.expect("list").items.is_empty(), "no pod for a refused job");
    world.cluster.kubectl_ok(&["delete", "ll", "stolen", "-n", &world.namespace, "--wait=true"]);
}

/// Update on the jobs' finalizers is needed: with OwnerReferencesPermissionEnforcement, an
/// account that may create pods but lacks it cannot create one owned by a job with
/// blockOwnerDeletion, as the operator's worker pods are.
async fn owner_references_need_the_finalizers_grant(world: &World) {
    let job = world.job().await.expect("the job");
    let uid = job["metadata"]["uid"].as_str().expect("its uid");
    let (namespace, account) = (world.namespace.as_str(), "creates-pods-only");
    world.cluster.kubectl_ok(&["-n", namespace, "create", "serviceaccount", account]);
    world.cluster.kubectl_ok(&["-n", namespace, "create", "role", account, "--verb=create", "--resource=pods"]);
    let subject = format!("--serviceaccount={namespace}:{account}");
    world.cluster.kubectl_ok(&[
        "-n",
        namespace,
        "create",
        "rolebinding",
        account,
        &format!("--role={account}"),
        &subject,
    ]);
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "owned", "ownerReferences": [{"apiVersion": "sedna.io/v1alpha1",
            "kind": "LifelongLearningJob", "name": JOB, "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), serde_json::to_vec(&pod).expect("json")).expect("write");
    let as_user = format!("--as=system:serviceaccount:{namespace}:{account}");
    let path = file.path().display().to_string();
    let output = world.cluster.kubectl(&["create", "-n", namespace, "-f", &path, &as_user]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("blockOwnerDeletion"),
        "a pod owned with blockOwnerDeletion was created without update on the job's finalizers: the API server \
         lacks --enable-admission-plugins=OwnerReferencesPermissionEnforcement (scripts/test sets it). {stderr}"
    );
}

/// The world's edge agent proves its node as a DaemonSet's would: a token of deploy/edge's
/// ServiceAccount bound to an agent pod on the node (audience perennial-link). Returns the pod.
async fn agent_pod_token(world: &World) -> String {
    // The node, so that kube-controller-manager does not collect the pod as an orphan.
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": world.node, "labels": {"perennial.io/test": "cluster"}}});
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.client.clone());
    let _ = nodes.create(&PostParams::default(), &serde_json::from_value(node).expect("a node")).await;
    let name = format!("agent-{}", world.namespace);
    let uid = crate::identity::create_pod(&world.client, EDGE, &name, EDGE, &world.node).await;
    let token = crate::identity::mint(&world.client, EDGE, EDGE, Some("perennial-link"), Some((&name, &uid))).await;
    std::fs::write(world.file("token"), token).expect("the agent's token");
    name
}

/// The first round's inference pod is gone or going once the second round deployed: the
/// Deploy's deletion by name took it (a request that named another pod, or another uid, would
/// have been answered 404 or 409, and counted as the grant's use all the same).
async fn first_inference_pod_deleted(world: &World, kubelet: &Kubelet) {
    let first = kubelet.pods("inference").into_iter().next().expect("round 1's inference pod");
    let name = first.metadata.name.clone().expect("a name");
    until("round 1's inference pod deleted", Duration::from_secs(30), || async {
        match world.pods().get_opt(&name).await.expect("a pod read") {
            None => Some(()),
            Some(pod) => pod.metadata.deletion_timestamp.map(|_| ()),
        }
    })
    .await;
}

/// Two whole rounds and a deletion, as the operator of the world's kubeconfig, with its own pod
/// (`--pod-name`, labelled when it leads) and `overrides`; returns when the job is deleted.
/// The second round's Deploy deletes the pods it replaces by name (as past 1,000 worker pods in
/// a namespace), the job's deletion by label.
async fn round_and_deletion(world: &World, overrides: &[(&str, &str)]) {
    let since = Timestamp::now();
    let kubelet = world.kubelet();
    let overrides: Vec<(&str, &str)> = overrides.iter().copied().chain([("--delete-pods-by-name-past", "0")]).collect();
    let operator = world.start_operator_with("rbac", (free_port(), free_port()), &overrides);
    let edge = world.start_edge(operator.link_port);
    world.apply_job(5);
    world.append_samples(8);
    world.until_deployed(1, Duration::from_secs(120)).await;
    world.append_samples(8);
    world.until_deployed(2, Duration::from_secs(120)).await;
    first_inference_pod_deleted(world, &kubelet).await;
    world.cluster.kubectl_ok(&["delete", "ll", JOB, "-n", &world.namespace, "--wait=true", "--timeout=60s"]);
    leader_renewed(world.cluster, since).await;
    let forbidden = World::forbidden_calls(&[&operator]);
    assert!(forbidden.is_empty(), "the operator's RBAC refused calls: {forbidden:#?}");
    drop((edge, kubelet));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_wide_install_grants_what_the_operator_uses_and_nothing_more() {
    let cluster = cluster();
    audit_log(cluster);
    cluster.install();
    let since = Timestamp::now();
    let world = World::new("rbac").await;
    let client = world.client.clone();
    let other = cluster.namespace(&client, "rbac-other").await;
    let other = other.as_str();
    cluster.secret(&client, other, "db-password", &[("password", "not for the operator")]).await;
    cluster.secret(&client, &world.namespace, "models-s3", &[("ACCESS_KEY_ID", "a"), ("SECRET_ACCESS_KEY", "s")]).await;
    let agent = agent_pod_token(&world).await;
    // The operator's own pod, which it labels as the leader's (alone: rollout.rs does too).
    let labelling = cluster.labelling_operator_pods().await;
    let own_pod = format!("operator-{}", world.namespace);
    operator_pod(&client, SYSTEM, &own_pod).await;

    let kubelet = world.kubelet();
    // Deletions by name from the first pod on (as past 1,000 worker pods in a namespace).
    let overrides = [
        ("--link-tokens", "perennial-edge/perennial-edge-tokens"),
        ("--pod-name", own_pod.as_str()),
        ("--delete-pods-by-name-past", "0"),
    ];
    let operator = world.start_operator_with("rbac", (free_port(), free_port()), &overrides);
    let edge = world.start_edge(operator.link_port);
    world.apply_job(5);
    // The job's own Secret, by name: read (its metadata) with the namespace's grant.
    let credential = r#"{"spec":{"credentialName":"models-s3"}}"#;
    cluster.kubectl_ok(&["patch", "ll", JOB, "-n", &world.namespace, "--type", "merge", "-p", credential]);
    world.append_samples(8);
    world.until_deployed(1, Duration::from_secs(120)).await;
    // The second round's Deploy deletes the first round's inference pod by name; the job's
    // deletion below goes by label (deletecollection).
    world.append_samples(8);
    world.until_deployed(2, Duration::from_secs(120)).await;
    first_inference_pod_deleted(&world, &kubelet).await;
    owner_references_need_the_finalizers_grant(&world).await;
    a_secret_of_another_namespace_is_refused(&world, other).await;
    cluster.kubectl_ok(&["delete", "ll", JOB, "-n", &world.namespace, "--wait=true", "--timeout=60s"]);
    leader_renewed(cluster, since).await;
    let forbidden = World::forbidden_calls(&[&operator]);
    drop((edge, operator, kubelet));
    let _ = Api::<Pod>::namespaced(client.clone(), SYSTEM).delete(&own_pod, &Default::default()).await;
    drop(labelling);
    crate::identity::delete_pod(&client, EDGE, &agent).await;
    assert!(forbidden.is_empty(), "the operator's RBAC refused calls: {forbidden:#?}");

    let grants = bound(&client, (SYSTEM, "perennial-operator"), &[SYSTEM, EDGE, &world.namespace]).await;
    let made = requests(cluster, OPERATOR, since);
    assert_least_privilege(OPERATOR, &grants, &made);
    let read_other: Vec<&Request> = made.iter().filter(|r| r.namespace.as_deref() == Some(other)).collect();
    assert!(read_other.is_empty(), "the operator reached into another namespace: {read_other:#?}");

    // (c) What it must not do. Pods are created and deleted wherever jobs are (cluster wide:
    // the namespaced install is the one that confines them).
    let ns = world.namespace.as_str();
    assert_can(
        cluster,
        OPERATOR,
        &[
            (&["get", "secret/db-password", "-n", other], false),
            (&["get", "secrets", "-n", other], false),
            (&["list", "secrets", "-n", ns], false),
            (&["get", "secret/models-s3", "-n", ns], true),
            (&["get", "secret/perennial-edge-tokens", "-n", EDGE], true),
            (&["get", "secret/perennial-link-ca", "-n", EDGE], false),
            (&["get", "secret/perennial-link-tls", "-n", SYSTEM], false),
            (&["get", "pods", "-n", ns], false),
            (&["get", "pods", "-n", "kube-system"], false),
            (&["delete", "pods", "-n", ns], true),
            (&["patch", "pods", "-n", ns], false),
            (&["patch", "pods", "-n", SYSTEM], true),
            (&["get", "pods", "-n", EDGE], false),
            (&["watch", "pods", "-n", EDGE], true),
            (&["get", "lifelonglearningjobs.sedna.io", "--subresource=status", "-n", ns], false),
            (&["get", "datasets.sedna.io", "-n", ns], false),
            (&["get", "datasets.sedna.io", "--subresource=status", "-n", ns], false),
            (&["update", "lifelonglearningjobs.sedna.io", "-n", ns], false),
            (&["create", "pods", "-n", "kube-system"], true),
        ],
    );
}

/// The RBAC objects of `text` (YAML documents), with `perennial-system` made `system` and the
/// names of the Roles and bindings given `suffix`: the install of another operator beside the
/// cluster-wide one on the same API server.
fn renamed(text: &str, system: &str, suffix: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for mut document in perennial_deploy_checks::documents(text) {
        let kind = document["kind"].as_str().unwrap_or_default().to_owned();
        if matches!(kind.as_str(), "Namespace" | "CustomResourceDefinition" | "Deployment" | "Service") {
            continue;
        }
        if document["metadata"]["namespace"] == SYSTEM {
            document["metadata"]["namespace"] = json!(system);
        }
        if kind.contains("Role") {
            let name = format!("{}-{suffix}", document["metadata"]["name"].as_str().unwrap_or_default());
            document["metadata"]["name"] = json!(name);
        }
        if kind.ends_with("Binding") {
            let name = format!("{}-{suffix}", document["roleRef"]["name"].as_str().unwrap_or_default());
            document["roleRef"]["name"] = json!(name);
            for subject in document["subjects"].as_array_mut().into_iter().flatten() {
                subject["namespace"] = json!(system);
            }
        }
        out.push(document);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespaced_install_grants_only_the_namespaces_it_watches() {
    let cluster = cluster();
    audit_log(cluster);
    cluster.install();
    let mut world = World::new("rbac-ns").await;
    let client = world.client.clone();
    let second = cluster.namespace(&client, "rbac-ns2").await;
    let unwatched = cluster.namespace(&client, "rbac-unwatched").await;
    let (second, unwatched) = (second.as_str(), unwatched.as_str());
    cluster.secret(&client, unwatched, "db-password", &[("password", "not for the operator")]).await;
    // The README's command for a watched namespace, with each kubectl (`-n` places it).
    for kubectl in cluster.kubectls() {
        let args = ["apply", "-n", second, "-k", "deploy/operator-namespaced/watched"];
        let output = cluster.kubectl_with(&kubectl, &args);
        assert!(output.status.success(), "{kubectl} {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
    }
    // The same install for an operator of its own (its namespace, its ServiceAccount).
    let system = cluster.namespace(&client, "rbac-system").await;
    let suffix = system.clone();
    let kustomized = |folder: &str| cluster.kubectl_ok(&["kustomize", folder]);
    for document in renamed(&kustomized("deploy/operator-namespaced"), &system, &suffix) {
        apply(cluster, &document, None);
    }
    for namespace in [world.namespace.as_str(), second] {
        for document in renamed(&kustomized("deploy/operator-namespaced/watched"), &system, &suffix) {
            apply(cluster, &document, Some(namespace));
        }
    }
    // And deploy/edge's grants in the agents' namespace (it watches their pods there).
    let edge_grants = std::fs::read_to_string(crate::harness::repo().join("deploy/edge/operator-rbac.yaml"));
    for document in renamed(&edge_grants.expect("deploy/edge/operator-rbac.yaml"), &system, &suffix) {
        apply(cluster, &document, None);
    }
    let user = format!("system:serviceaccount:{system}:perennial-operator");
    // Bound once the API server's authorizer says so (its cache follows the bindings).
    for namespace in [world.namespace.as_str(), second] {
        let args = ["list", "lifelonglearningjobs.sedna.io", "-n", namespace];
        until("the namespaced install's grants in force", Duration::from_secs(10), || async {
            can(cluster, &user, &args).then_some(())
        })
        .await;
    }
    let since = Timestamp::now();
    world.operator_kubeconfig =
        cluster.service_account_kubeconfig(&client, &system, "perennial-operator", world.root.path()).await;
    let watched = format!("{},{second}", world.namespace);
    round_and_deletion(&world, &[("--namespace", &watched), ("--lease-namespace", &system)]).await;

    // Its own grants in the namespaces it watches and its own, and reviews cluster wide.
    let mine = [system.as_str(), world.namespace.as_str(), second, EDGE];
    let grants = bound(&client, (system.as_str(), "perennial-operator"), &mine).await;
    let made = requests(cluster, &user, since);
    assert!(
        made.iter().all(|r| !r.refused()),
        "{user} was refused: {:#?}",
        made.iter().filter(|r| r.refused()).collect::<Vec<_>>()
    );
    let outside: Vec<&Request> =
        made.iter().filter(|r| r.namespace.as_deref().is_some_and(|n| !mine.contains(&n))).collect();
    assert!(outside.is_empty(), "{user} reached outside its namespaces: {outside:#?}");
    let cluster_wide: Vec<&Grant> = grants.iter().filter(|g| g.namespace.is_none()).collect();
    assert!(
        cluster_wide.iter().all(|g| g.resource == "tokenreviews"),
        "only TokenReviews are granted cluster wide: {cluster_wide:#?}"
    );
    // Both watched namespaces are listed and watched.
    for namespace in [world.namespace.as_str(), second] {
        for resource in ["lifelonglearningjobs", "datasets", "pods"] {
            let watched = made
                .iter()
                .any(|r| r.verb == "watch" && r.resource == resource && r.namespace.as_deref() == Some(namespace));
            assert!(watched, "{resource} in {namespace} not watched: the operator watches each namespace given");
        }
    }

    let ns = world.namespace.as_str();
    assert_can(
        cluster,
        &user,
        &[
            (&["create", "pods", "-n", ns], true),
            (&["create", "pods", "-n", second], true),
            (&["create", "pods", "-n", "kube-system"], false),
            (&["create", "pods", "-n", unwatched], false),
            (&["deletecollection", "pods", "-n", "kube-system"], false),
            (&["delete", "pods", "-n", unwatched], false),
            (&["list", "pods", "--all-namespaces"], false),
            (&["list", "pods", "-n", unwatched], false),
            (&["list", "lifelonglearningjobs.sedna.io", "--all-namespaces"], false),
            (&["get", "secret/db-password", "-n", unwatched], false),
            (&["get", "secrets", "-n", ns], true),
            (&["list", "secrets", "-n", ns], false),
            (&["create", "tokenreviews.authentication.k8s.io"], true),
            (&["get", "pods", "-n", ns], false),
            (&["get", "lifelonglearningjobs.sedna.io", "--subresource=status", "-n", ns], false),
        ],
    );
}
