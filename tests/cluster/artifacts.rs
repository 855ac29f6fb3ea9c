//! Policies compiled by the operator for its nodes' platforms (issue #37, item 2), on a real API
//! server and a real link: a node says it runs Pulley (what a 32-bit ARM board runs), the
//! operator compiles the job's policies for it in a child process, signs them, and the node
//! fetches them over the link and runs a round without compiling anything. A copy altered on the
//! node's disk is refused and fetched again; a node that trusts another key refuses them all
//! and the job says why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::harness::free_port;
use crate::stack::World;

/// `perennial plugin keygen NAME` in the world's folder: (private key, public key).
fn keygen(world: &World, name: &str) -> (String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["plugin", "keygen", &world.file(name).display().to_string()])
        .output()
        .expect("run perennial plugin keygen");
    assert!(output.status.success(), "keygen: {}", String::from_utf8_lossy(&output.stderr));
    let path = |ext: &str| world.file(&format!("{name}.{ext}")).display().to_string();
    (path("key"), path("pub"))
}

/// The files in `dir` (and below) whose names end with `suffix`.
fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path, suffix));
        } else if path.display().to_string().ends_with(suffix) {
            found.push(path);
        }
    }
    found
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_compiles_for_a_pulley_node_which_compiles_nothing_and_refuses_an_altered_copy() {
    let world = World::new("artifacts").await;
    let (key, public) = keygen(&world, "operator");
    let artifact_dir = world.file("operator-artifacts");
    let link_port = free_port();
    let flags = [("--sign-key", key.as_str()), ("--artifact-dir", &artifact_dir.display().to_string())];
    let _operator = world.start_operator_with("artifacts-a", (free_port(), link_port), &flags);
    let edge_cache = world.file("edge-cache").display().to_string();
    // The node runs Pulley: code the operator's own (x86_64) engine could not run itself.
    let env = [("PERENNIAL_POLICY_PLATFORM", "pulley64"), ("PERENNIAL_CACHE_DIR", edge_cache.as_str())];
    let mut edge = world.start_edge_with(link_port, &["--trust-key", &public], &env);
    let _kubelet = world.kubelet();
    world.apply_job(50);
    world.append_samples(100);
    world.until_deployed(1, Duration::from_secs(180)).await;

    // Compiled once per component for pulley64, by the operator; fetched by the node.
    let compiled = files(&artifact_dir, ".pcwasm");
    assert!(compiled.iter().all(|path| path.display().to_string().contains(".pulley64.")), "{compiled:?}");
    assert!(compiled.len() >= 2, "the trigger and the selector at least: {compiled:?}\n{}", world.logs());
    let fetched = files(&world.file("edge-state/artifacts"), ".bin");
    assert!(fetched.len() >= 2, "the node fetched them: {fetched:?}");
    for path in &fetched {
        let name = path.file_stem().unwrap_or_default().to_string_lossy().to_string();
        assert_eq!(sha256_hex(&std::fs::read(path).expect("read")), name, "{} is intact", path.display());
    }
    // The node compiled nothing: its compile cache has no entry.
    assert_eq!(files(Path::new(&edge_cache), ".cwasm"), Vec::<PathBuf>::new(), "the node compiled a policy");
    // The job's status names what serves (the edge queues it within a second of the start,
    // which a round of instant workers may beat).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let job = world.job().await.unwrap_or_default();
        let trigger = &job["status"]["policies"]["trigger"];
        if trigger["health"] == "Serving" {
            assert_eq!(trigger["plugin"], "builtin:threshold-trigger", "{trigger}");
            assert_eq!(trigger.get("message"), None, "{trigger}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the trigger is not said serving: {:#}", job["status"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A byte of each copy on the node's disk altered while the agent was down: each is refused
    // on its next read, never loaded, fetched again, and the next round runs.
    edge.kill();
    for path in &fetched {
        let mut bytes = std::fs::read(path).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x20;
        std::fs::write(path, bytes).expect("alter");
    }
    let edge = world.start_edge_with(link_port, &["--trust-key", &public], &env);
    world.append_samples(100);
    world.until_deployed(2, Duration::from_secs(180)).await;
    let log = edge.log_text();
    assert!(log.contains("deleted, and fetched again"), "the altered copies are said refused:\n{log}");
    for path in &fetched {
        let name = path.file_stem().unwrap_or_default().to_string_lossy().to_string();
        let bytes = std::fs::read(path).expect("fetched again");
        assert_eq!(sha256_hex(&bytes), name, "{} fetched again intact", path.display());
    }
    assert_eq!(files(Path::new(&edge_cache), ".cwasm"), Vec::<PathBuf>::new(), "the node compiled a policy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_trusts_another_key_loads_none_of_the_operators_artifacts_and_says_why() {
    let world = World::new("artifacts-key").await;
    let (key, _) = keygen(&world, "operator");
    let (_, other) = keygen(&world, "other");
    let link_port = free_port();
    let artifact_dir = world.file("operator-artifacts").display().to_string();
    let flags = [("--sign-key", key.as_str()), ("--artifact-dir", artifact_dir.as_str())];
    let _operator = world.start_operator_with("artifacts-b", (free_port(), link_port), &flags);
    let edge_cache = world.file("edge-cache").display().to_string();
    let env = [("PERENNIAL_POLICY_PLATFORM", "pulley64"), ("PERENNIAL_CACHE_DIR", edge_cache.as_str())];
    let edge = world.start_edge_with(link_port, &["--trust-key", &other], &env);
    world.apply_job(50);
    // The agent says why, once per reason: the operator's key is not the one it trusts.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let message = loop {
        let log = edge.log_text();
        if let Some(line) = log.lines().find(|line| line.contains("not by the key this node trusts")) {
            break line.to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "no word on the refused artifact:\n{}", world.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(message.contains("not by the key this node trusts"), "{message}");
    // And the job says it too, in status.policies.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let job = world.job().await.unwrap_or_default();
        let trigger = &job["status"]["policies"]["trigger"];
        if trigger["message"].as_str().is_some_and(|said| said.contains("not by the key this node trusts")) {
            assert_eq!(trigger["health"], "LoadFailed", "{trigger}");
            assert_eq!(trigger["plugin"], "builtin:threshold-trigger", "{trigger}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "status.policies says nothing of it: {:#}", job["status"]);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing was loaded, and nothing compiled on the node instead.
    assert_eq!(files(Path::new(&edge_cache), ".cwasm"), Vec::<PathBuf>::new(), "the node compiled a policy");
    let job = world.job().await.expect("the job");
    assert!(job["status"]["round"].as_u64().unwrap_or(0) == 0, "no round may start: {:#}", job["status"]);
}
