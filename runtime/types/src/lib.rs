//! The words both halves of Perennial share, with no Kubernetes and no Wasm in them: a round's
//! stages and phases, what its workers are given and produce (Sedna's `ConditionData`), policy
//! references and health, and a node's jobs and reports. The resources (`perennial-api`), the
//! edge agent, the link and the operator all build on these.

pub mod docker_auths;
pub mod files;
pub mod node;
pub mod policy;
pub mod records;
pub mod registry_auth;
pub mod round;
pub mod stage;

pub use node::{
    DEFAULT_EVAL_SET_SIZE, JobConfig, JobSpec, NodeJob, NodeJobMeta, NodeWorker, PolicyArtifact, Report, StageNotice,
    new_worker_name, node_job,
};
pub use policy::{
    BUILTIN_POLICIES, Limits, OciRef, OnError, PolicyDecision, PolicyHealth, PolicyLoading, PolicyRef, PolicyStatus,
    PolicyStatuses, ShadowDisagreement, ShadowRef, ShadowStatus, Source, ValidRef, config_digest, config_text_digest,
    parse_source,
};
pub use records::RecordRetention;
pub use registry_auth::{Password, RegistryAuth, RegistryLogin};
pub use round::{ConditionData, Input, Model, Output};
pub use stage::{Phase, Stage};
