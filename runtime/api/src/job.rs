//! `LifelongLearningJob` (Sedna's `lifelonglearningjob_types.go`), with Perennial's optional
//! fields: `spec.dataset.splitPolicy`, `spec.trainSpec.trigger.policy`,
//! `spec.deploySpec.selectPolicy`, and `timeoutSeconds` per stage.
//!
//! The pod templates are behind an `Arc`: typed, a template is 1.8 KiB inline, and the operator's
//! job store, which holds them as text, shares one empty template among all its jobs.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::status::LifelongLearningJobStatus;
use perennial_types::PolicyRef;

/// Sedna's LifelongLearningJob spec.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sedna.io",
    version = "v1alpha1",
    kind = "LifelongLearningJob",
    plural = "lifelonglearningjobs",
    shortname = "ll",
    namespaced,
    status = "LifelongLearningJobStatus",
    doc = "Sedna's LifelongLearningJob: endless rounds of train, eval and deploy over a Dataset's new samples."
)]
#[kube(printcolumn = r#"{"name":"Stage","type":"string","jsonPath":".status.stage"}"#)]
#[kube(printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.phase"}"#)]
#[kube(printcolumn = r#"{"name":"Round","type":"integer","jsonPath":".status.round"}"#)]
#[kube(printcolumn = r#"{"name":"Deployed","type":"string","jsonPath":".status.deployed.url"}"#)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct LifelongLearningJobSpec {
    pub dataset: DatasetRef,
    pub train_spec: TrainSpec,
    pub eval_spec: EvalSpec,
    pub deploy_spec: DeploySpec,
    /// A Secret with S3 credentials for `outputDir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
    /// A path on the nodes, or `s3://bucket/prefix`.
    #[schemars(length(min = 1), pattern(super::crd::LOCATION_PATTERN))]
    pub output_dir: String,
    /// Perennial: how many of the job's policy decision records the edge keeps, and how long
    /// (default the newest 10000, none older than a week); read them with `perennial decisions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_records: Option<perennial_types::RecordRetention>,
}

/// `spec.dataset`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetRef {
    /// A Dataset in the job's namespace.
    pub name: String,
    /// The share of new samples that goes to training, in [0, 1].
    #[schemars(range(min = 0.0, max = 1.0))]
    pub train_prob: f64,
    /// Perennial: the splitter policy. Absent: Sedna's `trainProb` rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_policy: Option<PolicyRef>,
}

/// `spec.trainSpec`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainSpec {
    #[schemars(
        description = "The train worker's pod template (core/v1 PodTemplateSpec).",
        transform = super::crd::without_nested_descriptions
    )]
    pub template: Arc<PodTemplateSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// Perennial: fail the stage when its worker runs longer than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: Option<u64>,
}

/// `spec.evalSpec`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvalSpec {
    #[schemars(
        description = "The eval worker's pod template (core/v1 PodTemplateSpec).",
        transform = super::crd::without_nested_descriptions
    )]
    pub template: Arc<PodTemplateSpec>,
    /// Perennial: fail the stage when its worker runs longer than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: Option<u64>,
    /// Perennial: each round's eval set is the most recent this many eval samples of the job
    /// (default 100), however the dataset grew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub eval_set_size: Option<u64>,
}

pub use perennial_types::DEFAULT_EVAL_SET_SIZE;

/// `spec.deploySpec`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploySpec {
    #[schemars(
        description = "The inference worker's pod template (core/v1 PodTemplateSpec).",
        transform = super::crd::without_nested_descriptions
    )]
    pub template: Arc<PodTemplateSpec>,
    /// Perennial: the selector policy. Absent: Sedna's rule (the first evaluated model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select_policy: Option<PolicyRef>,
    /// Perennial: fail the deploy when the inference worker is not running after this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: Option<u64>,
}

/// `spec.trainSpec.trigger`: Sedna's condition and daily window, or a policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Trigger {
    /// How often to ask the trigger when no sample arrives (Sedna ignores it; Perennial does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub check_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer: Option<Timer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<TriggerCondition>,
    /// Perennial: the trigger policy. Absent: the built-in `threshold-trigger` with this object
    /// as its config (Sedna's rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRef>,
}

/// `trigger.timer`: a daily window from `start` to `end` in `HH:MM`, node-local time, both
/// minutes included (Sedna's); `start` after `end` wraps midnight, `start == end` is one minute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Timer {
    #[schemars(pattern(super::crd::START_PATTERN))]
    pub start: String,
    #[schemars(pattern(super::crd::END_PATTERN))]
    pub end: String,
}

/// `trigger.condition`: `metric operator threshold`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TriggerCondition {
    #[schemars(extend("enum" = super::crd::OPERATORS))]
    pub operator: String,
    pub threshold: f64,
    /// Absent: `num_of_samples`, as in the built-in trigger's config.
    #[serde(default = "num_of_samples")]
    pub metric: String,
}

fn num_of_samples() -> String {
    "num_of_samples".into()
}

/// The built-in rules the absent policy fields mean.
impl LifelongLearningJobSpec {
    /// The trigger: `trigger.policy`, or Sedna's rule over the trigger object.
    pub fn trigger_policy(&self) -> PolicyRef {
        let trigger = self.train_spec.trigger.clone().unwrap_or_default();
        if let Some(policy) = trigger.policy {
            return policy;
        }
        // Sedna ignores checkPeriodSeconds; 0 there means "not set", not "ask all the time".
        let check_period_seconds = trigger.check_period_seconds.filter(|s| *s > 0);
        let config =
            serde_json::to_value(Trigger { policy: None, check_period_seconds, ..trigger }).unwrap_or_default();
        PolicyRef::new("builtin:threshold-trigger").with_config(config)
    }

    /// What a failing trigger policy falls back to: Sedna's rule over the trigger object, when
    /// the job gives both a policy and Sedna's condition.
    pub fn fallback_trigger(&self) -> Option<PolicyRef> {
        let trigger = self.train_spec.trigger.as_ref()?;
        trigger.policy.as_ref()?;
        trigger.condition.as_ref()?;
        let sedna = LifelongLearningJobSpec {
            train_spec: TrainSpec {
                trigger: Some(Trigger { policy: None, ..trigger.clone() }),
                ..self.train_spec.clone()
            },
            ..self.clone()
        };
        Some(sedna.trigger_policy())
    }

    /// The selector: `deploySpec.selectPolicy`, or Sedna's rule.
    pub fn select_policy(&self) -> PolicyRef {
        self.deploy_spec.select_policy.clone().unwrap_or_else(|| PolicyRef::new("builtin:first-select"))
    }
}
