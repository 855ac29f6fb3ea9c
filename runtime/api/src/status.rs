//! The job's status: Sedna's (`conditions`, `knowledgeBase`, `startTime`, `completionTime`),
//! with the conditions capped, plus what Perennial adds so that a reader sees where the job is
//! without replaying the conditions: the stage and phase, the round, the retries, the worker,
//! the deployed model and each policy's health.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Time;
pub use perennial_types::{ConditionData, Input, Model, Output, Phase, PolicyHealth, PolicyStatus, Stage};

/// Sedna's list grows forever (13 entries a round); Perennial keeps the newest this many (a
/// whole round: 14 when nothing fails), with `data` only on the newest of each stage and type.
pub const MAX_CONDITIONS: usize = 16;

/// Sedna's condition: `(stage, type)` with its JSON `data` as a string.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobCondition {
    #[serde(rename = "type")]
    pub type_: Phase,
    /// Always `"True"`, as in Sedna.
    pub status: String,
    pub stage: Stage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// JSON of [`ConditionData`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

/// The model serving now.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeployedModel {
    pub round: u64,
    /// Where the inference worker reads it (`<outputDir>/deploy/index.pkl`).
    pub url: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub format: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub metrics: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// The worker of the current stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerRef {
    /// The worker's name (the pod, or the local process's `WORKER_NAME`).
    pub name: String,
    pub stage: Option<Stage>,
    pub round: u64,
    /// Times it was restarted or recreated in this stage.
    #[serde(default)]
    pub restarts: u32,
    /// Of those, times it was recreated after it vanished.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recreations: u32,
    /// The node it runs on, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When it was first started in this stage (a stage timeout counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
}

/// Sedna's status, and Perennial's summary of the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifelongLearningJobStatus {
    /// The newest 16 conditions (a whole round; [`MAX_CONDITIONS`]), oldest first; `data` on the
    /// newest of each stage and type only.
    #[serde(default)]
    pub conditions: Vec<JobCondition>,
    /// Sedna's knowledge-base summary, kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub knowledge_base: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// The current stage and where it is (the newest condition's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The current round, counted from 1; 0 before the first.
    #[serde(default)]
    pub round: u64,
    /// When the current (stage, phase) began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_since: Option<Time>,
    /// What the current stage was started with, and what it produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<ConditionData>,
    /// The current stage's worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerRef>,
    /// Failed rounds in a row; reset when a round completes.
    #[serde(default)]
    pub retries: u32,
    /// After a failure, when the job goes back to Train.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Time>,
    /// Rounds that went through Deploy.
    #[serde(default)]
    pub rounds_completed: u64,
    /// The newest train result: the next train worker's `CLOUD_KB_INDEX`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_trained: Option<Model>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployed: Option<DeployedModel>,
    /// The trigger, splitter and selector, by kind.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub policies: perennial_types::PolicyStatuses,
    /// Why the job is where it is (the last decision, refusal or failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// An error the edge meets again and again (reading the index, a stage's files), with how
    /// many times and since when; gone when it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
