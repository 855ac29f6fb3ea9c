//! A worker pod as the operator keeps it: the few fields it reads (metadata, node, phase, Ready
//! condition, container states and restarts, the pod's reason and message), deserialised straight
//! from the API server's pods (unknown fields ignored), so the rest is never allocated.
//!
//! Every worker pod of every job sits in the pod store (`watches`). A k8s-openapi `Pod` is
//! 2,176 bytes inline (its `PodSpec` alone 1,416, `PodStatus` 400, `ObjectMeta` 360), and each
//! `ContainerStatus` 752 more on the heap, though the operator reads a handful of fields: at
//! 10,000 jobs of three pods, tens of MiB against a 512 MiB target. Pods are still created whole
//! (`Api<Pod>::create`); only what is kept and judged is this type.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, Pod, PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Serialize};

/// A pod, as far as the operator reads it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WorkerPod {
    /// Whole: labels and annotations, name, uid, resourceVersion, times, and the owner reference
    /// by which the Controller maps a pod to its job.
    pub metadata: ObjectMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<WorkerPodSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<WorkerPodStatus>,
}

/// Of the spec, only where the pod runs (the worker's node, for the stage machine).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WorkerPodSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

/// What `observe` judges a worker by.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WorkerPodStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<WorkerPodCondition>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_statuses: Option<Vec<WorkerContainerStatus>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_container_statuses: Option<Vec<WorkerContainerStatus>>,
}

/// A pod condition (the operator reads Ready: whether, and since when).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WorkerPodCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// A container's status: its restarts, and its state (waiting on what, or how it ended).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WorkerContainerStatus {
    pub name: String,
    pub restart_count: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<ContainerState>,
}

/// The same resource as `Pod` (`/api/v1/.../pods`): an `Api<WorkerPod>` lists and watches pods
/// into this type.
impl kube::Resource for WorkerPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::kind(&())
    }

    fn group(_: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::group(&())
    }

    fn version(_: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::version(&())
    }

    fn api_version(_: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::api_version(&())
    }

    fn plural(_: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A whole pod (the API server's answer to a create) as the operator keeps it.
impl From<Pod> for WorkerPod {
    fn from(pod: Pod) -> WorkerPod {
        WorkerPod {
            metadata: pod.metadata,
            spec: pod.spec.map(WorkerPodSpec::from),
            status: pod.status.map(WorkerPodStatus::from),
        }
    }
}

impl From<PodSpec> for WorkerPodSpec {
    fn from(spec: PodSpec) -> WorkerPodSpec {
        WorkerPodSpec { node_name: spec.node_name }
    }
}

impl From<PodStatus> for WorkerPodStatus {
    fn from(status: PodStatus) -> WorkerPodStatus {
        let containers = |statuses: Option<Vec<ContainerStatus>>| {
            statuses.map(|statuses| statuses.into_iter().map(WorkerContainerStatus::from).collect())
        };
        WorkerPodStatus {
            phase: status.phase,
            reason: status.reason,
            message: status.message,
            conditions: status.conditions.map(|c| c.into_iter().map(WorkerPodCondition::from).collect()),
            container_statuses: containers(status.container_statuses),
            init_container_statuses: containers(status.init_container_statuses),
        }
    }
}

impl From<PodCondition> for WorkerPodCondition {
    fn from(condition: PodCondition) -> WorkerPodCondition {
        WorkerPodCondition {
            type_: condition.type_,
            status: condition.status,
            last_transition_time: condition.last_transition_time,
        }
    }
}

impl From<ContainerStatus> for WorkerContainerStatus {
    fn from(status: ContainerStatus) -> WorkerContainerStatus {
        WorkerContainerStatus { name: status.name, restart_count: status.restart_count, state: status.state }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use serde_json::json;

    /// A pod as the API server sends it (a watch event's object, a list's item).
    fn full_pod() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "job-train-x", "namespace": "ml", "uid": "p-1", "resourceVersion": "4711",
                "creationTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": "2026-01-01T00:09:00Z",
                "labels": {"lifelonglearningjob.sedna.io/uid": "u-1", "lifelonglearningjob.sedna.io/worker-type": "train"},
                "annotations": {"perennial.io/worker-name": "train-worker-x"},
                "ownerReferences": [{"apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob",
                                     "name": "job", "uid": "u-1", "controller": true}],
                "managedFields": [{"manager": "perennial-operator", "operation": "Update"}]
            },
            "spec": {
                "nodeName": "edge-1",
                "restartPolicy": "OnFailure",
                "containers": [{"name": "train", "image": "worker:1",
                    "env": [{"name": "BASE_MODEL_URL", "value": "s3://models/base"}],
                    "volumeMounts": [{"name": "output", "mountPath": "/output"}]}],
                "initContainers": [{"name": "storage-initializer", "image": "perennial:1", "args": ["fetch"]}],
                "volumes": [{"name": "output", "hostPath": {"path": "/var/lib/perennial"}}]
            },
            "status": {
                "phase": "Failed", "reason": "Evicted", "message": "low on memory",
                "hostIP": "10.0.0.5", "podIP": "10.1.0.7", "podIPs": [{"ip": "10.1.0.7"}],
                "startTime": "2026-01-01T00:00:01Z", "qosClass": "BestEffort",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"},
                    {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:05:00Z",
                     "reason": "PodFailed"}
                ],
                "initContainerStatuses": [{"name": "storage-initializer", "image": "perennial:1",
                    "imageID": "docker.io/perennial@sha256:00", "containerID": "containerd://a", "ready": true,
                    "restartCount": 1,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                             "finishedAt": "2026-01-01T00:00:30Z"}}}],
                "containerStatuses": [{"name": "train", "image": "worker:1",
                    "imageID": "docker.io/worker@sha256:11", "containerID": "containerd://b", "ready": false,
                    "restartCount": 2, "started": false,
                    "lastState": {"terminated": {"exitCode": 1}},
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                             "finishedAt": "2026-01-01T00:05:00Z"}}}]
            }
        })
    }

    fn time(at: &str) -> Time {
        Time(at.parse().expect("a time"))
    }

    /// What the operator reads of `pod`, all of it, as it must be for [`full_pod`].
    fn assert_read_fields(pod: &WorkerPod) {
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("job-train-x"));
        assert_eq!(meta.namespace.as_deref(), Some("ml"));
        assert_eq!(meta.uid.as_deref(), Some("p-1"));
        assert_eq!(meta.resource_version.as_deref(), Some("4711"));
        assert_eq!(meta.creation_timestamp, Some(time("2026-01-01T00:00:00Z")));
        assert_eq!(meta.deletion_timestamp, Some(time("2026-01-01T00:09:00Z")));
        let labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("lifelonglearningjob.sedna.io/uid").map(String::as_str), Some("u-1"));
        assert_eq!(labels.get("lifelonglearningjob.sedna.io/worker-type").map(String::as_str), Some("train"));
        let annotations = meta.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.get("perennial.io/worker-name").map(String::as_str), Some("train-worker-x"));
        let owners = meta.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.iter().map(|o| (o.uid.as_str(), o.controller)).collect::<Vec<_>>(), [("u-1", Some(true))]);
        assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some("edge-1"));

        let status = pod.status.clone().expect("a status");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Evicted"));
        assert_eq!(status.message.as_deref(), Some("low on memory"));
        let conditions = status.conditions.unwrap_or_default();
        let ready = conditions.iter().find(|c| c.type_ == "Ready").expect("the Ready condition");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.last_transition_time, Some(time("2026-01-01T00:05:00Z")));
        assert_eq!(conditions.len(), 2);

        let containers = status.container_statuses.unwrap_or_default();
        assert_eq!(containers.len(), 1);
        assert_eq!((containers[0].name.as_str(), containers[0].restart_count), ("train", 2));
        let ended = containers[0].state.as_ref().and_then(|s| s.terminated.as_ref()).expect("terminated");
        assert_eq!((ended.exit_code, ended.reason.as_deref()), (137, Some("OOMKilled")));
        assert_eq!(ended.finished_at, Some(time("2026-01-01T00:05:00Z")));
        let init = status.init_container_statuses.unwrap_or_default();
        assert_eq!(init.len(), 1);
        assert_eq!((init[0].name.as_str(), init[0].restart_count), ("storage-initializer", 1));
        assert!(init[0].state.as_ref().and_then(|s| s.terminated.as_ref()).is_some());
    }

    #[test]
    fn a_whole_pod_deserialises_into_the_fields_read() {
        let pod: WorkerPod = serde_json::from_value(full_pod()).expect("a worker pod");
        assert_read_fields(&pod);
    }

    #[test]
    fn a_pod_converted_keeps_the_same_fields_as_one_deserialised() {
        let whole: Pod = serde_json::from_value(full_pod()).expect("a pod");
        let converted = WorkerPod::from(whole);
        assert_read_fields(&converted);
        let read: WorkerPod = serde_json::from_value(full_pod()).expect("a worker pod");
        assert_eq!(converted, read);
    }

    #[test]
    fn what_is_missing_defaults_and_it_serialises_as_a_pod_reads() {
        let bare: WorkerPod = serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("a bare pod");
        assert_eq!((bare.spec, bare.status), (None, None));
        let pod: WorkerPod = serde_json::from_value(full_pod()).expect("a worker pod");
        let again: Pod = serde_json::from_value(serde_json::to_value(&pod).expect("json")).expect("a pod again");
        assert_eq!(WorkerPod::from(again), pod);
    }

    #[test]
    fn it_is_the_pod_resource() {
        assert_eq!(WorkerPod::url_path(&(), Some("ml")), "/api/v1/namespaces/ml/pods");
        assert_eq!(WorkerPod::url_path(&(), Some("ml")), Pod::url_path(&(), Some("ml")));
        assert_eq!((WorkerPod::kind(&()), WorkerPod::api_version(&())), (Pod::kind(&()), Pod::api_version(&())));
    }

    /// A regression that keeps the spec (or a whole status) again fails here.
    #[test]
    fn a_worker_pod_is_less_than_half_a_pod() {
        let (pod, worker) = (size_of::<Pod>(), size_of::<WorkerPod>());
        eprintln!("size_of::<Pod>() = {pod} bytes, size_of::<WorkerPod>() = {worker} bytes");
        eprintln!(
            "per container status: ContainerStatus {} bytes, WorkerContainerStatus {} bytes",
            size_of::<ContainerStatus>(),
            size_of::<WorkerContainerStatus>()
        );
        assert!(worker * 2 < pod, "WorkerPod is {worker} bytes, Pod {pod}");
        assert!(size_of::<WorkerContainerStatus>() * 2 < size_of::<ContainerStatus>());
    }
}
