//! deploy/helm/perennial, the Helm chart, as a user meets it. `helm lint` passes. `helm template`
//! renders what kustomize renders, object for object, parsed (not text): deploy/operator, with the
//! CRDs; the namespaced values, deploy/operator-namespaced with watched/'s Role in the namespace
//! watched; `edge.enabled`, deploy/edge; `operator.signKey`, deploy/operator-compiling;
//! `edge.trustKey`, deploy/edge-trusting. On the real API server, `helm install` into a fresh namespace installs the operator,
//! whose Deployment rolls out with the test playing the kubelet (rollout.rs's: a real `perennial
//! operator` for each pod, as the chart's ServiceAccount), the leader alone behind the chart's
//! Service; `helm upgrade --set` rolls out the changed Deployment; `helm uninstall` takes away
//! all it installed (the CRDs stay: Helm never deletes crds/).
//!
//! helm is `PERENNIAL_TEST_HELM`, or `helm` on the PATH (scripts/test installs it).

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::harness::{Cluster, cluster, repo, until};
use crate::rollout::{OperatorPods, kubelet, leader_behind_the_service, rollout_status};
use crate::stack::{JOB, World};

const CHART: &str = "deploy/helm/perennial";
/// deploy/'s namespace: with the release `perennial` there, the chart's objects have deploy/'s names.
const SYSTEM: &str = "perennial-system";
const RELEASE: &str = "perennial";
/// The namespace deploy/operator-namespaced/watch.yaml watches.
const WATCHED: &str = "perennial-jobs";
/// Labels that say who installed an object, not what it is: kustomize's commonLabels (which it
/// puts in selectors too), Helm's, and the release's (in the chart's selectors, so that each
/// release selects its own pods).
const INSTALLER_LABELS: [&str; 4] =
    ["app.kubernetes.io/part-of", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart"];

// ---- helm ----

/// `PERENNIAL_TEST_HELM`, or `helm` on the PATH; looked for once.
fn helm_binary() -> &'static str {
    static HELM: OnceLock<String> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(path) = std::env::var_os("PERENNIAL_TEST_HELM") {
            return path.to_string_lossy().into_owned();
        }
        match Command::new("helm").arg("version").output() {
            Ok(_) => "helm".to_owned(),
            Err(err) if err.kind() == ErrorKind::NotFound => {
                panic!("helm not found: run scripts/test, which installs it (or set PERENNIAL_TEST_HELM)")
            }
            Err(err) => panic!("running helm: {err}"),
        }
    })
}

/// `helm ARGS` as the cluster's admin, from the repository's root.
fn helm(cluster: &Cluster, args: &[&str]) -> Output {
    let helm = helm_binary();
    Command::new(helm)
        .args(args)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|err| panic!("running {helm}: {err}"))
}

/// `helm ARGS` that must succeed; its stdout.
fn helm_ok(cluster: &Cluster, args: &[&str]) -> String {
    let output = helm(cluster, args);
    assert!(
        output.status.success(),
        "helm {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `helm template` of the release `perennial` in `perennial-system`, with `values` (`--set ...`).
fn template(cluster: &Cluster, values: &[&str]) -> String {
    let mut args = vec!["template", RELEASE, CHART, "--namespace", SYSTEM];
    args.extend(values);
    helm_ok(cluster, &args)
}

// ---- Rendered objects, compared ----

/// Objects by `Kind namespace/name`, without their installer's labels.
type Objects = BTreeMap<String, Value>;

fn id(object: &Value) -> String {
    let meta = &object["metadata"];
    let namespace = meta["namespace"].as_str().unwrap_or_default();
    format!("{} {namespace}/{}", object["kind"].as_str().unwrap_or_default(), meta["name"].as_str().unwrap_or_default())
}

/// The documents of `text`, but for the kinds `left_out`.
fn objects(text: &str, left_out: &[&str]) -> Objects {
    let mut out = Objects::new();
    for mut object in perennial_deploy_checks::documents(text) {
        if left_out.contains(&object["kind"].as_str().unwrap_or_default()) {
            continue;
        }
        without_installer_labels(&mut object);
        out.insert(id(&object), object);
    }
    out
}

/// Takes [`INSTALLER_LABELS`] out of every label map and selector; a label map left empty goes.
fn without_installer_labels(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                if matches!(key.as_str(), "labels" | "matchLabels" | "selector")
                    && let Value::Object(labels) = item
                    && labels.values().all(Value::is_string)
                {
                    labels.retain(|label, _| !INSTALLER_LABELS.contains(&label.as_str()));
                }
                without_installer_labels(item);
            }
            map.retain(|key, item| !(key == "labels" && item.as_object().is_some_and(|labels| labels.is_empty())));
        }
        Value::Array(items) => items.iter_mut().for_each(without_installer_labels),
        _ => {}
    }
}

/// Where `a` and `b` differ, by JSON pointer (a field one lacks: null).
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    const ABSENT: &Value = &Value::Null;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys().filter(|key| !x.contains_key(*key))) {
                let (left, right) = (x.get(key).unwrap_or(ABSENT), y.get(key).unwrap_or(ABSENT));
                differences(left, right, &format!("{path}/{key}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            // A list of named items (env, volumes, mounts) is a set to Kubernetes: a kustomize
            // patch puts its items first, the chart where they read best.
            let (x, y) = (by_name(x), by_name(y));
            for (index, (left, right)) in x.iter().zip(&y).enumerate() {
                differences(left, right, &format!("{path}/{index}"), out);
            }
        }
        // The CRDs' `maximum: 4096.0`, which kustomize writes `4096`.
        (Value::Number(left), Value::Number(right)) if left.as_f64() == right.as_f64() => {}
        (left, right) if left == right => {}
        (left, right) => out.push(format!("{path}: kustomize {left}, helm {right}")),
    }
}

/// `items` sorted by their `name` when each has one; else as they are.
fn by_name(items: &[Value]) -> Vec<&Value> {
    let mut items: Vec<&Value> = items.iter().collect();
    if items.iter().all(|item| item["name"].is_string()) {
        items.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    }
    items
}

/// The chart renders the same objects as kustomize, each equal but for who installed it.
fn assert_same_objects(what: &str, kustomized: &Objects, charted: &Objects) {
    let ids = |objects: &Objects| objects.keys().cloned().collect::<Vec<_>>();
    assert_eq!(ids(charted), ids(kustomized), "{what}: the chart renders other objects than kustomize");
    for (id, object) in kustomized {
        let mut differ = Vec::new();
        differences(object, &charted[id], "", &mut differ);
        assert!(differ.is_empty(), "{what}: the chart's {id} is not kustomize's: {differ:#?}");
    }
}

/// `kubectl kustomize FOLDER`'s objects, but for the kinds `left_out`.
fn kustomize(cluster: &Cluster, folder: &str, left_out: &[&str]) -> Objects {
    objects(&cluster.kubectl_ok(&["kustomize", folder]), left_out)
}

/// The one Deployment of a render.
fn deployment(objects: &Objects) -> &Value {
    let mut deployments = objects.values().filter(|object| object["kind"] == "Deployment");
    let found = deployments.next().expect("a Deployment");
    assert!(deployments.next().is_none(), "one Deployment");
    found
}

#[test]
fn the_chart_lints_with_its_defaults_and_every_value_set() {
    let cluster = cluster();
    helm_ok(cluster, &["lint", "--strict", CHART]);
    let every_value = [
        "--set=rbac.namespaced=true",
        "--set=watchNamespaces={a,b}",
        "--set=edge.enabled=true",
        "--set=operator.signKey.secretName=perennial-policy-signing",
        "--set=edge.trustKey.secretName=perennial-policy-trust",
    ];
    let mut args = vec!["lint", "--strict", CHART];
    args.extend(every_value);
    helm_ok(cluster, &args);
}

/// The cluster-wide install: deploy/operator's objects and the CRDs (crds/, with
/// `--include-crds`). Not the Namespace: `helm install --namespace N --create-namespace` makes it.
#[test]
fn the_chart_renders_what_deploy_operator_renders() {
    let cluster = cluster();
    let kustomized = kustomize(cluster, "deploy/operator", &["Namespace"]);
    let charted = objects(&template(cluster, &["--include-crds"]), &[]);
    assert_same_objects("the cluster-wide install", &kustomized, &charted);
}

/// `rbac.namespaced` with `watchNamespaces`: deploy/operator-namespaced's objects, and watched/'s
/// Role and RoleBinding in each namespace watched (which the chart grants itself).
#[test]
fn the_namespaced_values_render_what_deploy_operator_namespaced_renders() {
    let cluster = cluster();
    let mut kustomized = kustomize(cluster, "deploy/operator-namespaced", &["Namespace", "CustomResourceDefinition"]);
    // watched/ as `kubectl apply -n perennial-jobs -k deploy/operator-namespaced/watched` puts it.
    for mut object in
        perennial_deploy_checks::documents(&cluster.kubectl_ok(&["kustomize", "deploy/operator-namespaced/watched"]))
    {
        object["metadata"]["namespace"] = json!(WATCHED);
        without_installer_labels(&mut object);
        kustomized.insert(id(&object), object);
    }
    let watching = format!("--set=watchNamespaces={{{WATCHED}}}");
    let namespaced: [&str; 2] = ["--set=rbac.namespaced=true", &watching];
    let charted = objects(&template(cluster, &namespaced), &[]);
    assert_same_objects("the namespaced install", &kustomized, &charted);

    // Two namespaces: both watched, each with its Role.
    let two = objects(&template(cluster, &["--set=rbac.namespaced=true", "--set=watchNamespaces={a,b}"]), &[]);
    let env = deployment(&two)["spec"]["template"]["spec"]["containers"][0]["env"].as_array().cloned();
    let watched = env.into_iter().flatten().find(|var| var["name"] == "PERENNIAL_NAMESPACE");
    assert_eq!(watched.map(|var| var["value"].clone()), Some(json!("a,b")), "PERENNIAL_NAMESPACE");
    for namespace in ["a", "b"] {
        for kind in ["Role", "RoleBinding"] {
            let id = format!("{kind} {namespace}/perennial-operator");
            assert!(two.contains_key(&id), "{id} is not rendered: {:?}", two.keys().collect::<Vec<_>>());
        }
    }
    // Namespaced without a namespace to watch: refused, saying why.
    let output = helm(cluster, &["template", RELEASE, CHART, "--set=rbac.namespaced=true"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("watchNamespaces"), "{stderr}");
}

/// `edge.enabled`: deploy/edge's objects (its Namespace too: the agents' own, privileged); none
/// by default.
#[test]
fn edge_enabled_renders_what_deploy_edge_renders() {
    let cluster = cluster();
    let kustomized = kustomize(cluster, "deploy/edge", &[]);
    let charted = objects(&template(cluster, &["--set=edge.enabled=true", "--show-only=templates/edge.yaml"]), &[]);
    assert_same_objects("the edge agent", &kustomized, &charted);
    let default = objects(&template(cluster, &[]), &[]);
    let edge: Vec<&String> = default.keys().filter(|id| id.contains("perennial-edge")).collect();
    assert!(edge.is_empty(), "the edge agent is rendered without edge.enabled: {edge:?}");
}

/// `operator.signKey.secretName`: deploy/operator-compiling's objects (the signing key, the
/// artifacts' volume, the compiles' memory).
#[test]
fn the_signing_key_value_renders_what_deploy_operator_compiling_renders() {
    let cluster = cluster();
    let kustomized = kustomize(cluster, "deploy/operator-compiling", &["Namespace", "CustomResourceDefinition"]);
    let charted = objects(&template(cluster, &["--set=operator.signKey.secretName=perennial-policy-signing"]), &[]);
    assert_same_objects("the signing key", &kustomized, &charted);
}

/// `edge.trustKey.secretName`: deploy/edge-trusting's objects.
#[test]
fn the_trust_key_value_renders_what_deploy_edge_trusting_renders() {
    let cluster = cluster();
    let kustomized = kustomize(cluster, "deploy/edge-trusting", &[]);
    let args = ["--set=edge.enabled=true", "--set=edge.trustKey.secretName=perennial-policy-trust"];
    let charted = objects(&template(cluster, &[&args[..], &["--show-only=templates/edge.yaml"]].concat()), &[]);
    assert_same_objects("the trust key", &kustomized, &charted);
}

// ---- On the API server ----

/// What the release installed, as `kubectl get -o name` names it: by Helm's instance label, in
/// its namespace and cluster wide.
fn installed(cluster: &Cluster, namespace: &str, release: &str) -> Vec<String> {
    let selector = format!("app.kubernetes.io/instance={release}");
    let kinds = "deployment,service,serviceaccount,role,rolebinding";
    let mut names = cluster.kubectl_ok(&["get", kinds, "-n", namespace, "-l", &selector, "-o", "name"]);
    names += &cluster.kubectl_ok(&["get", "clusterrole,clusterrolebinding", "-l", &selector, "-o", "name"]);
    let mut names: Vec<String> = names.lines().map(str::to_owned).collect();
    names.sort();
    names
}

/// The operator's image, and the one it gives worker pods' init containers (PERENNIAL_IMAGE).
async fn images(world: &World, namespace: &str, name: &str) -> (String, String) {
    let deployment = Api::<Deployment>::namespaced(world.client.clone(), namespace).get(name).await.expect("get");
    let spec = deployment.spec.and_then(|spec| spec.template.spec).expect("a pod spec");
    let container = spec.containers.into_iter().next().expect("a container");
    let mut env = container.env.into_iter().flatten();
    let workers = env.find(|var| var.name == "PERENNIAL_IMAGE").and_then(|var| var.value);
    (container.image.unwrap_or_default(), workers.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_the_operator_which_rolls_out_upgrades_and_uninstalls() {
    // The jobs' namespace (the operator reconciles this test's only), with the suite's CRDs.
    let mut world = World::new("helm-jobs").await;
    let cluster = world.cluster;
    // The release in a fresh namespace, named after it: its ClusterRoles (RELEASE-operator...)
    // are its own, beside deploy/operator's and other runs'.
    let namespace = cluster.namespace(&world.client, "helm").await;
    let release = namespace.clone();
    let operator = format!("{release}-operator");
    {
        // Helm creates the CRDs of crds/ that are absent (here the suite has applied them: Helm
        // leaves them as they are), as `kubectl apply -f deploy/crds/` does under this lock.
        let _applying = cluster.applying_cluster_wide();
        helm_ok(cluster, &["install", &release, CHART, "--namespace", &namespace]);
    }
    for crd in ["lifelonglearningjobs.sedna.io", "datasets.sedna.io"] {
        cluster.kubectl_ok(&["get", "crd", crd]);
    }
    let rbac = "rbac.authorization.k8s.io";
    let mut expected = vec![
        format!("clusterrole.{rbac}/{operator}"),
        format!("clusterrole.{rbac}/{operator}-credentials"),
        format!("clusterrolebinding.{rbac}/{operator}"),
        format!("deployment.apps/{operator}"),
        format!("role.{rbac}/{operator}-leader-election"),
        format!("rolebinding.{rbac}/{operator}-leader-election"),
        format!("service/{operator}"),
        format!("serviceaccount/{operator}"),
    ];
    expected.sort();
    assert_eq!(installed(cluster, &namespace, &release), expected, "what helm install installed");
    // As its NOTES say: the job namespace's Secrets (the link's node tokens here) for the operator.
    cluster.kubectl_ok(&[
        "-n",
        &world.namespace,
        "create",
        "rolebinding",
        &format!("{operator}-credentials"),
        &format!("--clusterrole={operator}-credentials"),
        &format!("--serviceaccount={namespace}:{operator}"),
    ]);

    // The pods run as the chart's ServiceAccount: a token of it, as a pod's own would be.
    world.operator_kubeconfig =
        cluster.service_account_kubeconfig(&world.client, &namespace, &operator, world.root.path()).await;
    let world = Arc::new(world);
    let pods = OperatorPods { namespace: namespace.clone(), selector: format!("app.kubernetes.io/instance={release}") };
    let stop = Arc::new(AtomicBool::new(false));
    let kubelet = tokio::spawn(kubelet(world.clone(), pods.clone(), stop.clone()));
    rollout_status(&world, &namespace, &operator);
    leader_behind_the_service(&world, &namespace, &operator).await;
    // The operator it deployed reconciles a job, as its ServiceAccount: the finalizer it puts on.
    world.apply_job(100);
    until("the job reconciled by the chart's operator", Duration::from_secs(90), || async {
        let job = world.job().await?;
        job["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty()).then_some(())
    })
    .await;
    // ... and lets it go when deleted (its finalizer released).
    cluster.kubectl_ok(&["-n", &world.namespace, "delete", "lifelonglearningjob", JOB, "--timeout=90s"]);

    // An upgrade with another image: both the container's and the workers' init containers'.
    let image = "ghcr.io/perennial-edge/perennial:0.1.1";
    helm_ok(
        cluster,
        &["upgrade", &release, CHART, "--namespace", &namespace, "--reuse-values", "--set=image.tag=0.1.1"],
    );
    assert_eq!(images(&world, &namespace, &operator).await, (image.to_owned(), image.to_owned()));
    rollout_status(&world, &namespace, &operator);
    leader_behind_the_service(&world, &namespace, &operator).await;

    // Uninstalled: every object gone, its pods stopped (the kubelet stops each as it goes).
    helm_ok(cluster, &["uninstall", &release, "--namespace", &namespace]);
    assert_eq!(installed(cluster, &namespace, &release), Vec::<String>::new(), "left by helm uninstall");
    let listed: Api<Pod> = Api::namespaced(world.client.clone(), &namespace);
    until("the operator's pods gone after helm uninstall", Duration::from_secs(90), || async {
        listed.list(&ListParams::default().labels(&pods.selector)).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let running = kubelet.await.expect("the test kubelet");
    assert!(running.is_empty(), "still running after helm uninstall: {:?}", running.keys().collect::<Vec<_>>());
    let releases = helm_ok(cluster, &["list", "--namespace", &namespace, "--short"]);
    assert!(releases.trim().is_empty(), "helm still lists: {releases}");
    // Helm never deletes crds/: other releases' and users' jobs stay.
    for crd in ["lifelonglearningjobs.sedna.io", "datasets.sedna.io"] {
        cluster.kubectl_ok(&["get", "crd", crd]);
    }
    for namespace in [&namespace, &world.namespace] {
        cluster.kubectl_ok(&["delete", "namespace", namespace, "--wait=false"]);
    }
}
