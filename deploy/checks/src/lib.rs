//! The plain checks of `deploy/`: what `kubectl apply -k deploy/operator` and `deploy/edge`
//! install, rendered by the real `kubectl kustomize` and read back as Kubernetes' own types, and
//! what `deploy/edge/install.sh` writes on a node. They depend on no part of the runtime
//! (`cargo test -p perennial-deploy-checks` builds k8s-openapi and serde, not wasmtime, kube or
//! SQLite).
//!
//! The few checks that need the `perennial` binary or its crates (every variable deploy/ sets is
//! one the binary reads; the CRDs are the ones the types generate) are in the CLI's tests
//! (tests/cli/deploy_env.rs), through the readers this crate makes public.

// The readers serve this crate's tests; outside them only the public ones are used.
#![cfg_attr(not(test), allow(dead_code))]

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod edge;
#[cfg(test)]
mod helm;
pub mod operator;
pub mod typed;

/// A path of the repository, from its root.
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

/// The documents of a multi-document YAML text (a kustomize render), empty ones left out.
pub fn documents(text: &str) -> Vec<serde_json::Value> {
    let mut documents = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value: serde_json::Value = serde::Deserialize::deserialize(document)
            .unwrap_or_else(|err| panic!("document {} is not YAML: {err}", index + 1));
        if !value.is_null() {
            documents.push(value);
        }
    }
    documents
}

/// `kubectl kustomize <folder>` (a folder of deploy/, from the repository's root), as
/// `kubectl apply -k` would install it; `None` when kubectl is missing, except under CI (`CI`
/// set), where that fails.
pub fn kustomize(folder: &str) -> Option<String> {
    let output = match Command::new("kubectl").arg("kustomize").arg(repo_path(folder)).output() {
        Ok(output) => output,
        Err(err) if err.kind() == ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CI").is_none(),
                "kubectl is not installed, and CI is set: install it (scripts/test does) to check {folder}"
            );
            eprintln!("skipped: kubectl is not installed ({folder} is not checked)");
            return None;
        }
        Err(err) => panic!("run kubectl: {err}"),
    };
    assert!(
        output.status.success(),
        "`kubectl kustomize {folder}` failed ({}); it is written for kubectl 1.20's kustomize v2 \
         (commonLabels, namespace, resources) and current ones: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Some(String::from_utf8(output.stdout).expect("kustomize prints UTF-8"))
}
