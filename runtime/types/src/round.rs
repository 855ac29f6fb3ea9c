//! What a stage's worker is started with and what it produced: Sedna's `ConditionData`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A model as workers report it (Sedna's `format`, `url`, `metrics`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Model {
    #[serde(default)]
    pub format: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub metrics: Option<serde_json::Value>,
}

/// Sedna's `ConditionData.input`: what a stage's worker is started with.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Input {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<Model>,
    #[serde(rename = "dataURL", default, skip_serializing_if = "Option::is_none")]
    pub data_url: Option<String>,
    #[serde(rename = "dataIndexURL", default, skip_serializing_if = "Option::is_none")]
    pub data_index_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_dir: Option<String>,
}

/// Sedna's `ConditionData.output`: what a stage's worker produced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Output {
    #[serde(default)]
    pub models: Vec<Model>,
}

/// Sedna's `ConditionData`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ConditionData {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Input>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Output>,
}
