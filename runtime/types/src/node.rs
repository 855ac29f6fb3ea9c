//! A node's jobs and reports: what the control plane sends an edge node about a job (its
//! config, the stage it moved the job to, the workers it started) and what the node reports
//! back. Both control planes (the operator over the link, the embedded mode in process) and the
//! edge agent speak these.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::policy::PolicyRef;
use crate::registry_auth::RegistryAuth;
use crate::round::{Input, Output};
use crate::stage::{Phase, Stage};

/// What the edge keeps of a job's spec.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    /// The dataset, `namespace/name`: its sample count is reported as its status.
    #[serde(default)]
    pub dataset: String,
    /// The dataset's index (`Dataset.spec.url`).
    pub dataset_url: String,
    /// `txt` or `csv`.
    pub dataset_format: String,
    /// `spec.outputDir`.
    pub output_dir: String,
    /// `spec.dataset.trainProb`.
    pub train_prob: f64,
    /// `spec.evalSpec.evalSetSize`: a round's eval set is the job's most recent this many eval
    /// samples. Absent: [`DEFAULT_EVAL_SET_SIZE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_set_size: Option<u64>,
    /// `spec.decisionRecords`: how many of the job's decision records are kept, and how long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_records: Option<crate::RecordRetention>,
}

/// `spec.evalSpec.evalSetSize` when a job does not give one: about what Sedna's five one-minute
/// batches hold at a modest rate, and enough to tell accuracies a few points apart.
pub const DEFAULT_EVAL_SET_SIZE: u64 = 100;

impl JobSpec {
    /// The eval set's size, the default filled in.
    pub fn eval_set_size(&self) -> u64 {
        self.eval_set_size.filter(|n| *n > 0).unwrap_or(DEFAULT_EVAL_SET_SIZE)
    }
}

impl JobSpec {
    /// Whether `other` reads and writes the same files (only its trainProb and eval set size may
    /// differ).
    pub fn same_files(&self, other: &JobSpec) -> bool {
        (&self.dataset, &self.dataset_url, &self.dataset_format, &self.output_dir)
            == (&other.dataset, &other.dataset_url, &other.dataset_format, &other.output_dir)
    }
}

/// What the edge needs to run one job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobConfig {
    /// `namespace/name`.
    pub name: String,
    pub uid: String,
    pub spec: JobSpec,
    /// The splitter; absent: Sedna's `trainProb` rule, computed natively.
    #[serde(default)]
    pub splitter: Option<PolicyRef>,
    pub trigger: PolicyRef,
    #[serde(default = "first_select")]
    pub selector: PolicyRef,
    /// The rule a failing trigger falls back to (`onError: fallback`): Sedna's condition, as
    /// the built-in threshold-trigger. Absent: a failing trigger holds the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_trigger: Option<PolicyRef>,
    /// Set by the operator for a node that runs policies it compiled (the node said its platform
    /// when it connected), by `plugin` string: the signed artifact to load instead of compiling.
    /// Not for hand-written job files.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub policy_artifacts: BTreeMap<String, PolicyArtifact>,
    /// Set by the operator: the logins for the registries of the job's `oci://` references, from
    /// the Secrets its pod templates name in `imagePullSecrets`. Over the link only: the edge
    /// strips it before it keeps the job. Not for hand-written job files.
    #[serde(default, skip_serializing_if = "RegistryAuth::is_empty")]
    pub registry_auth: RegistryAuth,
}

/// The operator's compile of one policy for one node's platform.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum PolicyArtifact {
    /// Compiled and signed: fetch it over the link by its digest.
    Ready {
        /// SHA-256 of the source component (what a job's `sha256` pins).
        component_sha256: String,
        /// SHA-256 of the artifact file, the name it is fetched by.
        artifact_sha256: String,
        /// The artifact's size in bytes (nothing larger is accepted).
        size: u64,
        platform: String,
    },
    /// Being compiled for `platform`: the previous policy serves until it is ready.
    Compiling { platform: String },
    /// The operator cannot compile it for this node, and why.
    Refused { reason: String },
}

impl JobConfig {
    /// Every policy reference the job loads: its policies, its fallback rules, its shadows.
    pub fn policy_plugins(&self) -> Vec<PolicyRef> {
        let mut refs = vec![self.trigger.clone(), self.selector.clone(), PolicyRef::new("builtin:first-select")];
        refs.extend(self.splitter.clone());
        refs.extend(self.fallback_trigger.clone());
        let shadows =
            [&self.trigger.shadow, &self.selector.shadow, &self.splitter.as_ref().and_then(|s| s.shadow.clone())];
        refs.extend(shadows.into_iter().flatten().map(|shadow| shadow.as_policy()));
        refs
    }
}

fn first_select() -> PolicyRef {
    PolicyRef::new("builtin:first-select")
}

/// A job as the cloud sends it to its node: a `desired` frame's `jobs` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeJob {
    pub metadata: NodeJobMeta,
    /// What the edge runs it with.
    pub config: JobConfig,
    /// The stage the control plane moved the job to (Waiting), with its round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<StageNotice>,
    /// The workers the control plane started for the job on this node (their pods'
    /// `WORKER_NAME`): only these may report through the worker API.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<NodeWorker>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeWorker {
    pub name: String,
    pub round: i64,
    /// On the wire as Sedna's report `kind`: `train`, `eval` or `deploy`.
    #[serde(with = "report_kind")]
    pub stage: Stage,
}

/// A stage as Sedna's lower-case report `kind`.
mod report_kind {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    use crate::stage::Stage;

    pub fn serialize<S: Serializer>(stage: &Stage, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(stage.report_kind())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Stage, D::Error> {
        let text = String::deserialize(deserializer)?;
        Stage::parse(&text).ok_or_else(|| D::Error::custom(format!("stage {text:?} is not train, eval or deploy")))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeJobMeta {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// What the edge is told: the job waits in `stage` for `round`'s step (Train: `round` is the
/// last round, done or failed; the edge starts the next one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageNotice {
    pub stage: Stage,
    pub round: u64,
    /// Round `round` failed: its train samples go back to the next round.
    #[serde(default)]
    pub failed: bool,
}

impl NodeJob {
    /// The job's key, `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }
}

/// Reads a desired job object; the error names the job and the field.
pub fn node_job(key: &str, object: &Value) -> Result<NodeJob, String> {
    let job: NodeJob = serde_path_to_error::deserialize(object).map_err(|err| format!("job {key}: {err}"))?;
    if job.config.name != key {
        return Err(format!("job {key}: config.name is {}, not the job's key", job.config.name));
    }
    Ok(job)
}

/// One report about a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub job: String,
    pub job_uid: String,
    pub round: i64,
    /// The stage reported on (Sedna's field name).
    pub phase: Stage,
    /// `Ready`, `Completed` or `Failed`.
    pub status: Phase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Input>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Output>,
    /// Why, for a decision or a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A train result the edge follows at once with the next stage's Ready (it prepares the eval
    /// set as soon as it relays the result, not when told): the control plane may wait a moment
    /// for it and write both in one status change. Absent from older agents.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub next_follows: bool,
}

/// A fresh worker name: Sedna's prefix (`train-worker`, `eval-worker`, `inferworker`) and a
/// 96-bit random token, so that a name cannot be guessed by another process on the node.
pub fn new_worker_name(stage: &str) -> Result<String, getrandom::Error> {
    let mut token = [0u8; 12];
    getrandom::fill(&mut token)?;
    let prefix =
        if stage == "deploy" || stage == "inference" { "inferworker".to_owned() } else { format!("{stage}-worker") };
    Ok(format!("{prefix}-{}", hex::encode(token)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_stage_travels_as_sednas_report_kind() {
        let worker = NodeWorker { name: "inferworker-0".into(), round: 2, stage: Stage::Deploy };
        let wire = serde_json::to_value(&worker).unwrap();
        assert_eq!(wire, serde_json::json!({"name": "inferworker-0", "round": 2, "stage": "deploy"}));
        assert_eq!(serde_json::from_value::<NodeWorker>(wire).unwrap(), worker);
        let bad = serde_json::json!({"name": "w", "round": 1, "stage": "warmup"});
        let err = serde_json::from_value::<NodeWorker>(bad).unwrap_err().to_string();
        assert!(err.contains("stage \"warmup\" is not train, eval or deploy"), "{err}");
    }
}
