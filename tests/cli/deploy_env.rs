//! deploy/ configures `perennial` through environment variables, and installs the CRDs: each
//! variable the DaemonSet, install.sh and the operator's Deployment set is one the binary reads
//! (clap lists them in its help as `[env: NAME=]`), and the CRDs are the ones `perennial crd`
//! generates. The rest of deploy/'s checks need no binary: perennial-deploy-checks
//! (deploy/checks).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use perennial_deploy_checks::{edge, operator};

/// `perennial edge --help`: clap lists each variable it reads as `[env: NAME=]`.
fn edge_help() -> &'static str {
    static HELP: OnceLock<String> = OnceLock::new();
    HELP.get_or_init(|| {
        let output =
            Command::new(env!("CARGO_BIN_EXE_perennial")).args(["edge", "--help"]).output().expect("run perennial");
        assert!(output.status.success(), "perennial edge --help: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).expect("the help is UTF-8")
    })
}

fn assert_read_by_the_agent<'a>(what: &str, names: impl IntoIterator<Item = &'a str>) {
    let help = edge_help();
    let unread: Vec<_> = names
        .into_iter()
        .filter(|name| !edge::NOT_FLAGS.contains(name) && !help.contains(&format!("[env: {name}=")))
        .collect();
    assert!(unread.is_empty(), "{what} sets {unread:?}, which `perennial edge --help` does not list:\n{help}");
}

#[test]
fn the_agent_reads_every_variable_the_daemonset_sets() {
    let Some(daemonset) = edge::daemonset() else { return };
    let container = edge::agent(daemonset);
    let names: Vec<_> = edge::env(container).into_keys().collect();
    assert!(names.len() >= 7, "{names:?}");
    assert_read_by_the_agent("the DaemonSet", names);
}

#[test]
fn the_agent_reads_every_variable_install_writes() {
    let node = edge::installed();
    let env = edge::env_file(node.root.path());
    assert!(env.len() >= 6, "{env:?}");
    assert_read_by_the_agent("install.sh's edge.env", env.keys().map(String::as_str));
}

#[test]
fn crds_are_the_generated_ones() {
    let Some(rendered) = operator::rendered() else { return };
    let generated: Vec<CustomResourceDefinition> = serde_yaml_ng::Deserializer::from_str(&perennial_api::crds_yaml())
        .map(|document| serde::Deserialize::deserialize(document).unwrap())
        .collect();
    let by_name = |crds: &[CustomResourceDefinition]| -> BTreeMap<String, CustomResourceDefinition> {
        crds.iter().map(|crd| (crd.metadata.name.clone().unwrap_or_default(), crd.clone())).collect()
    };
    let installed = by_name(&rendered.crds);
    let generated = by_name(&generated);
    assert_eq!(installed.keys().collect::<Vec<_>>(), generated.keys().collect::<Vec<_>>());
    let expected: BTreeMap<_, _> = operator::LABELS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    for (name, crd) in &installed {
        // kustomize's labels, which `perennial crd` (so deploy/crds/) gives them too: `apply -f
        // deploy/crds/` and `apply -k deploy/operator` agree.
        assert_eq!(crd.metadata.labels.as_ref(), Some(&expected), "{name}: labels");
        assert_eq!(generated[name].metadata.labels.as_ref(), Some(&expected), "{name}: labels of `perennial crd`");
        let versions: Vec<_> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(versions, ["v1alpha1"], "{name}");
        assert!(crd == &generated[name], "{name} differs from `perennial crd`: regenerate deploy/crds/");
    }
}

/// The Deployment configures `perennial operator` through PERENNIAL_* variables: each is one
/// the subcommand reads (clap lists them in its help as `[env: NAME=]`).
#[test]
fn operator_reads_the_env_the_deployment_sets() {
    let Some(rendered) = operator::rendered() else { return };
    let output = Command::new(env!("CARGO_BIN_EXE_perennial")).args(["operator", "--help"]).output().unwrap();
    assert!(output.status.success(), "perennial operator --help: {}", String::from_utf8_lossy(&output.stderr));
    let help = String::from_utf8_lossy(&output.stdout);
    let names: Vec<_> = operator::env(operator::operator_container(operator::deployment(rendered)))
        .into_keys()
        .filter(|name| name.starts_with("PERENNIAL_"))
        .collect();
    assert!(names.len() >= 2, "{names:?}");
    let unread: Vec<_> = names.iter().filter(|name| !help.contains(&format!("env: {name}="))).collect();
    assert!(unread.is_empty(), "`perennial operator --help` does not list {unread:?}:\n{help}");
}

/// Lease timings that would let a leader act after a standby may take over are refused at
/// once, naming the flags, before anything is read.
#[test]
fn operator_refuses_a_renew_deadline_not_inside_the_lease() {
    for (duration, deadline) in [("15", "15"), ("15", "20"), ("15", "1")] {
        let output = Command::new(env!("CARGO_BIN_EXE_perennial"))
            .args(["operator", "--kubeconfig", "/nonexistent/kubeconfig"])
            .args(["--lease-duration-secs", duration, "--lease-renew-deadline-secs", deadline])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{duration}/{deadline}: {stderr}");
        assert!(
            stderr.contains(&format!("--lease-renew-deadline-secs ({deadline})"))
                && stderr.contains(&format!("--lease-duration-secs ({duration})")),
            "{stderr}"
        );
        assert!(!stderr.contains("kubeconfig"), "said before the kubeconfig is read: {stderr}");
    }
}
