//! deploy/operator's Deployment rolled out and updated for real: kube-controller-manager makes
//! the ReplicaSets and pods (`up --controller-manager`), the test plays the kubelet — it runs
//! `perennial operator` for each pod with the pod's own env, reports the pod Ready from the
//! process's `/readyz`, and on deletion sends SIGTERM and removes the pod once the process is
//! gone. `kubectl rollout status` must return, before and after `kubectl rollout restart`, and
//! the link's Service must send edge nodes to the leader's pod only (its Endpoints).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::harness::{Process, free_port, until};
use crate::stack::World;

const SYSTEM: &str = "perennial-system";
const SELECTOR: &str = "app.kubernetes.io/name=perennial-operator";
/// The node the test kubelet runs the operator's pods on (the Service's endpoints name a node).
const NODE: &str = "perennial-test-operator-node";

/// One pod's `perennial operator`, as the kubelet runs it.
pub struct Container {
    pub process: Process,
    pub metrics_port: u16,
    pub link_port: u16,
    pub ip: String,
}

/// The operator's pods the test kubelet runs: those `selector` selects in `namespace`.
#[derive(Clone)]
pub struct OperatorPods {
    pub namespace: String,
    pub selector: String,
}

impl OperatorPods {
    /// deploy/operator's, in perennial-system.
    fn deploy_operator() -> OperatorPods {
        OperatorPods { namespace: SYSTEM.to_owned(), selector: SELECTOR.to_owned() }
    }
}

pub async fn ready(metrics_port: u16) -> bool {
    let url = format!("http://127.0.0.1:{metrics_port}/readyz");
    matches!(
        reqwest::Client::new().get(url).timeout(Duration::from_secs(1)).send().await,
        Ok(response) if response.status().is_success()
    )
}

/// The kubelet of the operator's pods `of`, until `stop`; each runs as the ServiceAccount of
/// `world.operator_kubeconfig`. Returns the containers still running.
pub async fn kubelet(world: Arc<World>, of: OperatorPods, stop: Arc<AtomicBool>) -> HashMap<String, Container> {
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), &of.namespace);
    let nodes: Api<Node> = Api::all(world.client.clone());
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}});
    let _ = nodes.create(&PostParams::default(), &serde_json::from_value(node).expect("a node")).await;
    let mut running: HashMap<String, Container> = HashMap::new();
    let mut next_ip = 1;
    while !stop.load(Ordering::SeqCst) {
        // The kubelet's heartbeat: its node stays Ready (the node lifecycle controller would
        // evict the pods of a node gone silent).
        let heartbeat = jiff::Timestamp::now().to_string();
        let status = json!({"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "the test plays the kubelet",
            "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat,
        }]}});
        let _ = nodes.patch_status(NODE, &PatchParams::default(), &Patch::Strategic(&status)).await;
        let Ok(listed) = pods.list(&ListParams::default().labels(&of.selector)).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        for pod in listed.items {
            let name = pod.metadata.name.clone().unwrap_or_default();
            if pod.metadata.deletion_timestamp.is_some() {
                if let Some(mut container) = running.remove(&name) {
                    container.process.terminate(Duration::from_secs(30)).await;
                }
                let _ = pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
                continue;
            }
            if pod.spec.as_ref().and_then(|spec| spec.node_name.as_ref()).is_none() {
                // The scheduler's part: bind the pod to the node.
                let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                                     "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}});
                let bound =
                    pods.create_subresource::<Value, Value>("binding", &name, &PostParams::default(), &binding).await;
                if bound.is_err() {
                    continue;
                }
            }
            let container = running.entry(name.clone()).or_insert_with(|| {
                next_ip += 1;
                start(&world, &pod, (&of.namespace, &name), format!("10.99.0.{next_ip}"))
            });
            let is_ready = ready(container.metrics_port).await;
            let status = json!({"status": {
                "phase": "Running",
                "podIP": container.ip,
                "podIPs": [{"ip": container.ip}],
                "conditions": [
                    {"type": "Ready", "status": if is_ready { "True" } else { "False" }},
                    {"type": "ContainersReady", "status": if is_ready { "True" } else { "False" }},
                ],
                "containerStatuses": [{
                    "name": "operator", "ready": is_ready, "restartCount": 0, "image": "perennial",
                    "imageID": "", "started": true, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                }],
            }});
            let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    running
}

/// `perennial operator` with the pod's env (its downward API filled in), on free loopback
/// ports, as the operator's ServiceAccount, watching only this test's namespace.
fn start(world: &World, pod: &Pod, (namespace, name): (&str, &str), ip: String) -> Container {
    let spec = pod.spec.as_ref().expect("a pod spec");
    let container = spec.containers.first().expect("the operator's container");
    assert_eq!(container.command.as_deref(), Some(&["perennial".to_owned(), "operator".to_owned()][..]));
    let mut env: Vec<(String, String)> = Vec::new();
    for var in container.env.iter().flatten() {
        let value = match (&var.value, var.value_from.as_ref().and_then(|from| from.field_ref.as_ref())) {
            (Some(value), _) => value.clone(),
            (None, Some(field)) if field.field_path == "metadata.name" => name.to_owned(),
            (None, Some(field)) if field.field_path == "metadata.namespace" => namespace.to_owned(),
            _ => panic!("env {} of the operator's container: nothing the test kubelet can fill in", var.name),
        };
        env.push((var.name.clone(), value));
    }
    // What differs on a shared test machine: loopback ports, this test's files, one namespace.
    let (metrics_port, link_port) = (free_port(), free_port());
    let file = |name: &str| world.file(name).display().to_string();
    let overrides = [
        ("PERENNIAL_METRICS_ADDR", format!("127.0.0.1:{metrics_port}")),
        ("PERENNIAL_LINK_ADDR", format!("127.0.0.1:{link_port}")),
        ("PERENNIAL_LINK_CERT", file("link.crt")),
        ("PERENNIAL_LINK_KEY", file("link.key")),
        ("PERENNIAL_LINK_TOKENS", format!("{}/edge-tokens", world.namespace)),
        ("PERENNIAL_NAMESPACE", world.namespace.clone()),
        ("RUST_LOG", "info".to_owned()),
    ];
    for (key, value) in overrides {
        env.retain(|(name, _)| name != key);
        env.push((key.to_owned(), value));
    }
    let args = ["operator".to_owned(), "--kubeconfig".to_owned(), world.operator_kubeconfig.display().to_string()];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let process = Process::start(&args, world.file(&format!("{name}.log")), &env);
    Container { process, metrics_port, link_port, ip }
}

/// `kubectl rollout status` of Deployment `namespace/name` returns, with every kubectl.
pub fn rollout_status(world: &World, namespace: &str, name: &str) {
    let deployment = format!("deployment/{name}");
    for kubectl in world.cluster.kubectls() {
        let output = world
            .cluster
            .kubectl_with(&kubectl, &["rollout", "status", &deployment, "-n", namespace, "--timeout=120s"]);
        assert!(
            output.status.success(),
            "{kubectl} rollout status did not complete: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The leader's pod in `namespace`: the holder of the Lease (the operator's default,
/// `perennial-operator`), the only pod labelled `perennial.io/role=leader`, and the only address
/// of the Endpoints of the link's Service `service`.
pub async fn leader_behind_the_service(world: &World, namespace: &str, service: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), namespace);
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), namespace);
    let endpoints: Api<Endpoints> = Api::namespaced(world.client.clone(), namespace);
    until("one leader, labelled, alone behind the Service", Duration::from_secs(60), || async {
        let holder = leases.get("perennial-operator").await.ok()?.spec?.holder_identity?;
        let labelled = pods.list_metadata(&ListParams::default().labels("perennial.io/role=leader")).await.ok()?;
        let labelled: Vec<String> = labelled.items.into_iter().filter_map(|pod| pod.metadata.name).collect();
        let addresses: Vec<String> = endpoints
            .get(service)
            .await
            .ok()?
            .subsets
            .into_iter()
            .flatten()
            .flat_map(|subset| subset.addresses.into_iter().flatten())
            .filter_map(|address| address.target_ref.and_then(|target| target.name))
            .collect();
        (labelled == [holder.clone()] && addresses == [holder.clone()]).then_some(holder)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_replicas_roll_out_and_a_rolling_update_completes_with_the_service_on_the_leader() {
    let _operator_pods = crate::harness::operator_deployment().lock().await;
    let world = Arc::new(World::new("rollout").await);
    world.cluster.fresh_operator_deployment(true);
    // Alone in labelling the operator's pods (rbac.rs runs an operator with a pod there too).
    let _labelling = world.cluster.labelling_operator_pods().await;
    // kube-controller-manager turns the Deployment into a ReplicaSet: without one, say what to start.
    let sets: Api<ReplicaSet> = Api::namespaced(world.client.clone(), SYSTEM);
    until(
        "a ReplicaSet of deploy/operator: this test needs kube-controller-manager (`../shared/k8s/up \
         --controller-manager`, as scripts/test starts it; or `scripts/kube-server` with it beside kube-apiserver)",
        Duration::from_secs(30),
        || async { (!sets.list(&ListParams::default().labels(SELECTOR)).await.ok()?.items.is_empty()).then_some(()) },
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let kubelet = tokio::spawn(kubelet(world.clone(), OperatorPods::deploy_operator(), stop.clone()));

    rollout_status(&world, SYSTEM, "perennial-operator");
    let first = leader_behind_the_service(&world, SYSTEM, "perennial-operator").await;

    let restarted = world.cluster.kubectl_ok(&["rollout", "restart", "deployment/perennial-operator", "-n", SYSTEM]);
    assert!(restarted.contains("restarted"), "{restarted}");
    rollout_status(&world, SYSTEM, "perennial-operator");
    let second = leader_behind_the_service(&world, SYSTEM, "perennial-operator").await;
    assert_ne!(first, second, "the rolling update replaced the leader's pod too");
    // `rollout status` does not wait for the old pods to stop: the test kubelet stops them first.
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), SYSTEM);
    until("the old replicas stopped and gone", Duration::from_secs(60), || async {
        (pods.list(&ListParams::default().labels(SELECTOR)).await.ok()?.items.len() == 2).then_some(())
    })
    .await;

    stop.store(true, Ordering::SeqCst);
    let running = kubelet.await.expect("the test kubelet");
    assert_eq!(running.len(), 2, "two replicas run after the update: {:?}", running.keys().collect::<Vec<_>>());
    let leader = running.get(&second).expect("the leader's pod runs");
    let serving = format!("http://127.0.0.1:{}/leaderz", leader.metrics_port);
    let answer = reqwest::get(serving).await.expect("the leader's /leaderz");
    assert!(answer.status().is_success(), "the leader serves: {}", answer.status());
    tokio::net::TcpStream::connect(("127.0.0.1", leader.link_port)).await.expect("the leader's link listens");
    let standby = running.iter().find(|(name, _)| **name != second).map(|(_, c)| c).expect("a standby");
    assert!(ready(standby.metrics_port).await, "the standby is ready too");
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", standby.link_port)).await.is_err(),
        "a standby serves no link"
    );
}
