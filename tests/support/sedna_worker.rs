//! A Sedna worker as the cluster tests and bench play it: what its pod's status says while it
//! runs and when it is done (the kubelet's part), and the report Sedna's library sends at the end
//! of a train or eval worker, from the pod's env (`OUTPUT_URL`, `MODEL_URLS`, `DATA_PATH_PREFIX`).

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// The status patch of a pod that runs and is ready.
pub fn running() -> Value {
    json!({"status": {"phase": "Running", "hostIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now()}],
        "containerStatuses": [{"name": "worker", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"running": {"startedAt": now()}}}]}})
}

/// The status patch of a pod whose worker exited 0.
pub fn succeeded() -> Value {
    json!({"status": {"phase": "Succeeded",
        "containerStatuses": [{"name": "worker", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now(), "startedAt": now()}}}]}})
}

/// The pod's env, by name.
pub fn env_of(pod: &Pod) -> BTreeMap<String, String> {
    let container = &pod.spec.as_ref().expect("spec").containers[0];
    container.env.iter().flatten().map(|e| (e.name.clone(), e.value.clone().unwrap_or_default())).collect()
}

/// A train (`kind` "train": writes its model where `OUTPUT_URL` says) or eval worker's report
/// body, its paths without `DATA_PATH_PREFIX` as Sedna's library reports them.
pub fn report(pod: &Pod, namespace: &str, kind: &str) -> Value {
    report_on(pod, namespace, kind, Path::new("/"))
}

/// [`report`] by a worker on a node whose `/` is the folder `node_root` here.
pub fn report_on(pod: &Pod, namespace: &str, kind: &str, node_root: &Path) -> Value {
    let env = env_of(pod);
    let prefix = env.get("DATA_PATH_PREFIX").cloned().unwrap_or_default();
    let host = |path: &str| path.strip_prefix(&prefix).unwrap_or(path).to_owned();
    let results = if kind == "train" {
        let output = host(&env["OUTPUT_URL"]);
        let here = node_root.join(output.trim_start_matches('/'));
        std::fs::create_dir_all(&here).expect("train output");
        std::fs::write(here.join("index.pkl"), format!("model of {}", env["WORKER_NAME"])).expect("model");
        let model = Path::new(&output).join("index.pkl");
        json!([{"format": "pkl", "url": model, "metrics": null}])
    } else {
        let models: Vec<String> = env["MODEL_URLS"].split(';').map(host).collect();
        Value::Array(
            models.iter().map(|m| json!({"format": "pkl", "url": m, "metrics": {"precision_score": 0.9}})).collect(),
        )
    };
    json!({"name": env["WORKER_NAME"], "namespace": namespace, "ownerName": env["JOB_NAME"],
        "ownerKind": "lifelonglearningjob", "kind": kind, "status": "completed", "results": results})
}
