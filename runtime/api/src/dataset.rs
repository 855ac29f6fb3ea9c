//! `Dataset`: an index file on a node, one sample per line (Sedna's `dataset_types.go`).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Time;

/// Sedna's Dataset spec.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sedna.io",
    version = "v1alpha1",
    kind = "Dataset",
    namespaced,
    status = "DatasetStatus",
    doc = "Sedna's Dataset: an index file on a node, a sample per line."
)]
#[kube(printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName"}"#)]
#[kube(printcolumn = r#"{"name":"Samples","type":"integer","jsonPath":".status.numberOfSamples"}"#)]
#[serde(rename_all = "camelCase")]
pub struct DatasetSpec {
    /// The index file: a path on `nodeName`, or `s3://bucket/key`.
    #[schemars(length(min = 1), pattern(super::crd::LOCATION_PATTERN))]
    pub url: String,
    /// `txt` (a sample per line) or `csv` (a header, then a sample per row); any case.
    #[schemars(pattern(super::crd::FORMAT_PATTERN))]
    pub format: String,
    /// The node whose agent watches the index and drives the jobs that use it.
    pub node_name: String,
    /// A Secret with S3 credentials for the index and its samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
}

/// Sedna's Dataset status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetStatus {
    /// Samples in the index (csv: without the header).
    #[serde(default)]
    pub number_of_samples: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_time: Option<Time>,
}
