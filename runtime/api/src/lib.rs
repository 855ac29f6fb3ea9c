//! The resources: Sedna's `sedna.io/v1alpha1` `LifelongLearningJob` and `Dataset`, field for
//! field, plus Perennial's optional fields (policy references, stage timeouts, and a status that
//! says the round, the deployed model and each policy's health). Sedna's manifests deserialize
//! unchanged.

mod crd;
mod dataset;
mod job;
pub mod manifest;
mod status;
#[cfg(test)]
mod tests;
mod validate;

pub use crd::{crds, crds_yaml};
pub use dataset::{Dataset, DatasetSpec, DatasetStatus};
pub use job::{
    DEFAULT_EVAL_SET_SIZE, DatasetRef, DeploySpec, EvalSpec, LifelongLearningJob, LifelongLearningJobSpec, Timer,
    TrainSpec, Trigger, TriggerCondition,
};
pub use status::{
    ConditionData, DeployedModel, Input, JobCondition, LifelongLearningJobStatus, MAX_CONDITIONS, Model, Output, Phase,
    PolicyHealth, PolicyStatus, Stage, WorkerRef,
};
pub use validate::{FieldErrors, credential_refusal, validate_dataset, validate_job, validate_pod};

/// Kubernetes' time type (RFC 3339 on the wire).
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// `namespace/name` of an object, `default` when the namespace is left out.
pub fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or(""))
}
