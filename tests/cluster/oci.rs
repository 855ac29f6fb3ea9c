//! An `oci://` policy on the cluster: the operator compiles it for a node that compiles nothing
//! (Pulley), pulling it from a real registry (started here) by the job's pinned digest; the node
//! runs a round on it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::harness::free_port;
use crate::registry::Registry;
use crate::stack::World;

fn perennial(args: &[&str], docker_config: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(args)
        .env("DOCKER_CONFIG", docker_config)
        .output()
        .expect("run perennial");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "perennial {args:?}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

fn pcwasm(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(pcwasm(&path));
        } else if path.extension().is_some_and(|ext| ext == "pcwasm") {
            found.push(path);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_compiles_an_oci_policy_pinned_by_digest_for_a_node_that_compiles_nothing() {
    let registry = Registry::start();
    let world = World::new("oci").await;
    let nobody = world.file("no-docker-config");
    let trigger = perennial_policy::builtin::built_plugin_path("threshold-trigger").expect("built");
    let reference = format!("{}:v1", registry.reference("policies/trigger"));
    let pushed = perennial(&["plugin", "push", trigger, &reference], &nobody);
    let sha256 = pushed
        .lines()
        .find_map(|line| line.trim().strip_prefix("sha256 ").map(|rest| rest.trim().to_owned()))
        .unwrap_or_else(|| panic!("no sha256 in: {pushed}"));

    let keys = world.file("operator").display().to_string();
    perennial(&["plugin", "keygen", &keys], &nobody);
    let (key, public) = (format!("{keys}.key"), format!("{keys}.pub"));
    let artifact_dir = world.file("operator-artifacts");
    let link_port = free_port();
    let flags = [("--sign-key", key.as_str()), ("--artifact-dir", &artifact_dir.display().to_string())];
    let _operator = world.start_operator_with("oci", (free_port(), link_port), &flags);
    let edge_cache = world.file("edge-cache").display().to_string();
    let env = [("PERENNIAL_POLICY_PLATFORM", "pulley64"), ("PERENNIAL_CACHE_DIR", edge_cache.as_str())];
    let _edge = world.start_edge_with(link_port, &["--trust-key", &public], &env);
    let _kubelet = world.kubelet();
    let policy = serde_json::json!({
        "plugin": reference, "sha256": sha256,
        "config": {"condition": {"operator": ">=", "threshold": 50}}
    });
    world.apply_job_with_trigger(50, Some(policy));
    world.append_samples(100);
    world.until_deployed(1, Duration::from_secs(240)).await;

    // The operator compiled the pulled component for the node; the job says the oci:// policy
    // serves, by its digest.
    assert!(!pcwasm(&artifact_dir).is_empty(), "no artifact compiled:\n{}", world.logs());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let job = world.job().await.unwrap_or_default();
        let trigger = &job["status"]["policies"]["trigger"];
        if trigger["health"] == "Serving" && trigger["plugin"] == reference.as_str() {
            assert_eq!(trigger["digest"], sha256.as_str(), "{trigger}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the oci:// trigger is not said serving: {:#}", job["status"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
