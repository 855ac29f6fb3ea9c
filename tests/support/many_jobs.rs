//! Many jobs in one manifest file, each with a Dataset of its own: what the idle-run test and the
//! rounds bench run.

/// `jobs` Datasets (`data-I`, index `data/I/index.txt`) and jobs (`job-I`, output `output/I`,
/// training from 8 new train samples), every worker running `command` (a YAML flow sequence).
pub fn manifests(jobs: usize, command: &str) -> String {
    let template =
        |name: &str| format!("{{spec: {{containers: [{{name: {name}, image: none, command: {command}}}]}}}}");
    let (train, eval, inference) = (template("train"), template("eval"), template("inference"));
    (0..jobs)
        .map(|i| {
            format!(
                "apiVersion: sedna.io/v1alpha1
kind: Dataset
metadata: {{name: data-{i}, namespace: default}}
spec: {{url: data/{i}/index.txt, format: txt, nodeName: local}}
---
apiVersion: sedna.io/v1alpha1
kind: LifelongLearningJob
metadata: {{name: job-{i}, namespace: default}}
spec:
  dataset: {{name: data-{i}, trainProb: 0.8}}
  outputDir: output/{i}
  trainSpec:
    trigger: {{condition: {{operator: '>=', threshold: 8, metric: num_of_samples}}}}
    template: {train}
  evalSpec:
    template: {eval}
  deploySpec:
    template: {inference}
---
"
            )
        })
        .collect()
}
