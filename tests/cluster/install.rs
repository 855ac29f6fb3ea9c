//! The README's install commands with every kubectl, Sedna's own sample manifests applied
//! unchanged, the printer columns, and an invalid object refused by the schema with its field.

use crate::harness::{cluster, repo};

/// `kubectl apply -f deploy/crds/` and `kubectl apply -k deploy/operator`, client-side
/// validation on, with each kubectl of `PERENNIAL_TEST_KUBECTL` (Debian's 1.20 and a current one
/// in CI); applied twice, as an upgrade would (the last-applied annotation must fit); and
/// deploy/operator-compiling and deploy/edge-trusting valid to both.
#[tokio::test]
async fn the_crds_and_the_operator_apply_with_every_kubectl() {
    let cluster = cluster();
    let applying = cluster.applying_cluster_wide();
    for kubectl in cluster.kubectls() {
        for args in [["apply", "-f", "deploy/crds/"], ["apply", "-k", "deploy/operator"]] {
            for _ in 0..2 {
                let output = cluster.kubectl_with(&kubectl, &args);
                let stderr = String::from_utf8_lossy(&output.stderr);
                assert!(output.status.success(), "{kubectl} {}: {stderr}", args.join(" "));
                // kustomize's deprecation notes are fine; a refusal or a dropped annotation is not.
                assert!(!stderr.contains("rror"), "{kubectl} {}: {stderr}", args.join(" "));
            }
        }
    }
    drop(applying);
    // The installs that compile for the nodes and trust the compiles: valid as they are, to
    // each kubectl and against the API server's schemas (a dry run: perennial-edge, which
    // other tests make and remove, need not exist).
    for kubectl in cluster.kubectls() {
        for folder in ["deploy/operator-compiling", "deploy/edge-trusting"] {
            let args = ["apply", "--dry-run=client", "--validate=true", "-k", folder];
            let output = cluster.kubectl_with(&kubectl, &args);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success() && !stderr.contains("rror"), "{kubectl} {}: {stderr}", args.join(" "));
        }
    }
    let crd = cluster.kubectl_ok(&["get", "crd", "lifelonglearningjobs.sedna.io", "-o", "json"]);
    let crd: serde_json::Value = serde_json::from_str(&crd).expect("json");
    assert!(
        crd["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].is_string(),
        "client-side apply kept its annotation"
    );
    let sa =
        cluster.kubectl_ok(&["get", "serviceaccount", "perennial-operator", "-n", "perennial-system", "-o", "name"]);
    assert_eq!(sa.trim(), "serviceaccount/perennial-operator");
}

/// Sedna's sample Dataset and LifelongLearningJob, byte for byte, are accepted; `kubectl get ll`
/// shows Perennial's columns; an invalid job is refused naming its field.
#[tokio::test]
async fn sednas_samples_apply_unchanged_and_bad_objects_are_refused_by_field() {
    let cluster = cluster();
    cluster.install();
    let client = cluster.client().await;
    let namespace = cluster.namespace(&client, "samples").await;
    let fixtures = repo().join("tests/fixtures/sedna");
    for file in ["dataset-atcii.yaml", "lifelonglearningjob-atcii.yaml"] {
        let path = fixtures.join(file);
        cluster.kubectl_ok(&["apply", "-n", &namespace, "-f", path.to_str().expect("path")]);
    }
    let table = cluster.kubectl_ok(&["get", "ll", "-n", &namespace]);
    let header: Vec<&str> = table.lines().next().expect("a header").split_whitespace().collect();
    assert_eq!(header, ["NAME", "STAGE", "STATUS", "ROUND", "DEPLOYED", "AGE"], "{table}");
    assert!(table.contains("atcii-classifier-demo"), "{table}");
    let described = cluster.kubectl_ok(&["describe", "ll", "atcii-classifier-demo", "-n", &namespace]);
    assert!(described.contains("Train Prob:") && described.contains("0.8"), "{described}");

    // The schema refuses what the agent would refuse, naming the field.
    let bad = r#"
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata: {name: bad-prob}
spec:
  dataset: {name: lifelong-dataset, trainProb: 1.5}
  trainSpec:
    template: {spec: {containers: [{name: t, image: i}]}}
    trigger: {condition: {operator: ">", threshold: 5, metric: num_of_samples}}
  evalSpec: {template: {spec: {containers: [{name: e, image: i}]}}}
  deploySpec: {template: {spec: {containers: [{name: d, image: i}]}}}
  outputDir: /output
"#;
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), bad).expect("write");
    let output = cluster.kubectl(&["apply", "-n", &namespace, "-f", file.path().to_str().expect("path")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a trainProb of 1.5 was accepted");
    assert!(stderr.contains("spec.dataset.trainProb"), "the refusal names the field: {stderr}");
    let listed = cluster.kubectl_ok(&["get", "ll", "-n", &namespace, "-o", "name"]);
    assert!(!listed.contains("bad-prob"), "nothing stored from a refused object: {listed}");
    cluster.kubectl_ok(&["delete", "namespace", &namespace, "--wait=false"]);
}
