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

use k8s_openapi::api::core::v1::{Container, PodSpec, Volume, VolumeMount};

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

/// The mount of `container` that holds `path` (the deepest one) and its volume in `pod`; `None`
/// when nothing mounted holds it (it would be on the image's filesystem, read-only in deploy/).
pub fn mount_holding<'a>(
    pod: &'a PodSpec,
    container: &'a Container,
    path: &str,
) -> Option<(&'a VolumeMount, &'a Volume)> {
    let holds = |mount: &&VolumeMount| {
        let base = mount.mount_path.trim_end_matches('/');
        path == base || path.starts_with(&format!("{base}/"))
    };
    let mount = container.volume_mounts.iter().flatten().filter(holds).max_by_key(|m| m.mount_path.len())?;
    let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name);
    Some((mount, volume.unwrap_or_else(|| panic!("the mount at {} names no volume {}", mount.mount_path, mount.name))))
}

/// Each variable of `container` whose value is an absolute path that no mount holds.
pub fn paths_on_no_volume(pod: &PodSpec, container: &Container) -> Vec<String> {
    let paths = container.env.iter().flatten().filter_map(|var| Some((&var.name, var.value.as_deref()?)));
    paths
        .filter(|(_, value)| value.starts_with('/') && mount_holding(pod, container, value).is_none())
        .map(|(name, value)| format!("{name}={value}"))
        .collect()
}

/// A quantity deploy/ writes (`64Mi`, `1Gi`, plain bytes), in bytes.
pub fn bytes(quantity: &str) -> u64 {
    let (number, unit) = quantity.split_at(quantity.find(|c: char| !c.is_ascii_digit()).unwrap_or(quantity.len()));
    let number: u64 = number.parse().unwrap_or_else(|_| panic!("{quantity:?} is not a quantity deploy/ writes"));
    let scale = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("{quantity:?}: the unit {other:?} is not one deploy/ writes"),
    };
    number * scale
}
