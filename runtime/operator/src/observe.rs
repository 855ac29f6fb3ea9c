//! What the stage machine sees of a job's pods (pure): the worker of a stage and round, from the
//! pods listed by the job's uid label.

use jiff::Timestamp;

use perennial_api::Stage;
use perennial_lifecycle::{WorkerObservation, WorkerPhase};
use perennial_workers::pod::{ROUND_LABEL, WORKER_ROUND_LABEL};

use super::worker_pod::{WorkerContainerStatus, WorkerPod};

/// Sedna's worker-type label.
pub const WORKER_TYPE_LABEL: &str = "lifelonglearningjob.sedna.io/worker-type";
/// Sedna's job uid label: the operator lists a job's pods by it.
pub const UID_LABEL: &str = "lifelonglearningjob.sedna.io/uid";

/// The pod of `stage` and `round` among a job's pods, as the stage machine reads it. The newest
/// wins when there are several (a re-created worker beside one still terminating).
pub fn worker_of(pods: &[WorkerPod], stage: Stage, round: u64, now: Timestamp) -> Option<WorkerObservation> {
    let kind = stage.worker_kind();
    pods.iter()
        .filter(|pod| label(pod, WORKER_TYPE_LABEL) == Some(kind))
        .filter(|pod| label(pod, ROUND_LABEL).and_then(|r| r.parse::<u64>().ok()) == Some(round))
        .max_by_key(|pod| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .map(|pod| observe(pod, stage, round, now))
}

/// Once `round` completes, the selector of the job's Train and Eval pods outside the newest
/// `kept` rounds, if the job has any not already being deleted; `None` when nothing is to go (or
/// `kept` is 0: every round stays, as in Sedna). The selector names the kept rounds (`notin`), so
/// its size is bounded by `kept`, however many rounds are left to prune.
pub fn prune_selector(pods: &[WorkerPod], uid: &str, round: u64, kept: u64) -> Option<String> {
    let oldest_kept = round.saturating_sub(kept.checked_sub(1)?);
    let any_older = pods
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| matches!(label(pod, WORKER_TYPE_LABEL), Some("train" | "eval")))
        .filter_map(|pod| label(pod, ROUND_LABEL)?.parse::<u64>().ok())
        .any(|pod_round| pod_round < oldest_kept);
    any_older.then(|| {
        let kept: Vec<String> = (oldest_kept..=round).map(|r| r.to_string()).collect();
        format!("{UID_LABEL}={uid},{WORKER_TYPE_LABEL} in (train,eval),{ROUND_LABEL} notin ({})", kept.join(","))
    })
}

/// The deletions of a Deploy of `round` that replaces the inference pod: the inference pods
/// there are (any round), and the Train and Eval pods the round's completion would prune
/// ([`prune_selector`]), done now with them. One selector naming each pod's worker-round label
/// when they all carry it, else one for each set (pods of an older operator); none when nothing
/// is to go. Pods already being deleted are not asked for again.
pub fn deploy_deletions(pods: &[WorkerPod], uid: &str, round: u64, kept: u64) -> Vec<String> {
    let going = deploy_going(pods, round, kept);
    if going.is_empty() {
        return Vec::new();
    }
    let named: Option<std::collections::BTreeSet<&str>> =
        going.iter().map(|pod| label(pod, WORKER_ROUND_LABEL)).collect();
    match named {
        Some(values) => {
            let values: Vec<&str> = values.into_iter().collect();
            vec![format!("{UID_LABEL}={uid},{WORKER_ROUND_LABEL} in ({})", values.join(","))]
        }
        None => {
            let inference = going.iter().any(|pod| label(pod, WORKER_TYPE_LABEL) == Some("inference"));
            let stop = inference.then(|| format!("{UID_LABEL}={uid},{WORKER_TYPE_LABEL}=inference"));
            stop.into_iter().chain(prune_selector(pods, uid, round, kept)).collect()
        }
    }
}

/// The pods a Deploy of `round` removes (what [`deploy_deletions`] selects): the inference pods
/// there are, and the Train and Eval pods outside the newest `kept` rounds; none already being
/// deleted.
pub fn deploy_going(pods: &[WorkerPod], round: u64, kept: u64) -> Vec<&WorkerPod> {
    let oldest_kept = kept.checked_sub(1).map(|k| round.saturating_sub(k));
    pods.iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| match label(pod, WORKER_TYPE_LABEL) {
            Some("inference") => true,
            Some("train" | "eval") => {
                let pod_round = label(pod, ROUND_LABEL).and_then(|r| r.parse::<u64>().ok());
                pod_round.zip(oldest_kept).is_some_and(|(pod_round, oldest)| pod_round < oldest)
            }
            _ => false,
        })
        .collect()
}

/// The pods a completed `round` prunes (what [`prune_selector`] selects): the Train and Eval
/// pods outside the newest `kept` rounds (none when `kept` is 0), not already being deleted.
pub fn prune_going(pods: &[WorkerPod], round: u64, kept: u64) -> Vec<&WorkerPod> {
    let Some(oldest_kept) = kept.checked_sub(1).map(|k| round.saturating_sub(k)) else { return Vec::new() };
    pods.iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| matches!(label(pod, WORKER_TYPE_LABEL), Some("train" | "eval")))
        .filter(|pod| label(pod, ROUND_LABEL).and_then(|r| r.parse::<u64>().ok()).is_some_and(|r| r < oldest_kept))
        .collect()
}

/// Whether the job's `pods` hold the worker of `stage` and `round` (not being deleted already):
/// what a failed Train or Eval stops.
pub fn any_to_stop(pods: &[WorkerPod], stage: Stage, round: u64) -> bool {
    let round = round.to_string();
    pods.iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| label(pod, WORKER_TYPE_LABEL) == Some(stage.worker_kind()))
        .any(|pod| label(pod, ROUND_LABEL) == Some(round.as_str()))
}

/// Waiting reasons that do not clear by themselves: a pod stuck on one this long has failed.
const STUCK: &[&str] =
    &["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"];
const STUCK_FOR_SECS: i64 = 300;

/// One pod as a worker observation.
pub fn observe(pod: &WorkerPod, stage: Stage, round: u64, now: Timestamp) -> WorkerObservation {
    let status = pod.status.clone().unwrap_or_default();
    let containers = status.container_statuses.clone().unwrap_or_default();
    let init = status.init_container_statuses.clone().unwrap_or_default();
    // An init container (the downloads) that crash-loops counts like the worker itself.
    let restarts = containers.iter().chain(&init).map(|c| u32::try_from(c.restart_count).unwrap_or(0)).sum();
    let terminated: Vec<_> =
        containers.iter().filter_map(|c| c.state.as_ref().and_then(|s| s.terminated.clone())).collect();
    let finished_at = terminated
        .iter()
        .filter_map(|t| t.finished_at.as_ref().map(|f| f.0))
        .max()
        // A Succeeded pod whose containers say nothing (garbage-collected statuses): the time
        // its Ready condition last moved, else its creation, so that the result grace ends.
        .or_else(|| ready_transition(pod))
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let created = pod.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let stuck = stuck_reason(&containers, &init).filter(|_| now.as_second() - created.as_second() >= STUCK_FOR_SECS);
    let phase = match status.phase.as_deref() {
        _ if stuck.is_some() && !deleting => WorkerPhase::Failed,
        // A pod being deleted is waited for, not counted as running: its replacement comes
        // once it is gone.
        _ if deleting => WorkerPhase::Pending,
        Some("Running") if stage == Stage::Deploy && !ready(pod) => WorkerPhase::Pending,
        Some("Running") => WorkerPhase::Running,
        Some("Succeeded") => WorkerPhase::Succeeded,
        Some("Failed") => WorkerPhase::Failed,
        _ => WorkerPhase::Pending,
    };
    let detail = match phase {
        WorkerPhase::Failed => stuck.or_else(|| failure_detail(pod)),
        _ => None,
    };
    WorkerObservation {
        name: pod.metadata.name.clone().unwrap_or_default(),
        stage,
        round,
        phase,
        restarts,
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        finished_at: match phase {
            WorkerPhase::Succeeded | WorkerPhase::Failed => finished_at,
            _ => None,
        },
        detail,
    }
}

fn label<'a>(pod: &'a WorkerPod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Whether the pod says it is Ready (an inference worker without a readiness probe is Ready
/// once its containers run).
fn ready(pod: &WorkerPod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

fn ready_transition(pod: &WorkerPod) -> Option<Timestamp> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == "Ready")?.last_transition_time.as_ref().map(|t| t.0)
}

/// The first container (init containers too) waiting on a reason that does not clear by itself.
fn stuck_reason(containers: &[WorkerContainerStatus], init: &[WorkerContainerStatus]) -> Option<String> {
    init.iter().chain(containers).find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref().filter(|r| STUCK.contains(r))?;
        let message = waiting.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
        Some(format!("container {} stuck in {reason}{message}", c.name))
    })
}

/// Why a pod failed: the pod's reason and message, or the first failed container's.
fn failure_detail(pod: &WorkerPod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if let Some(reason) = &status.reason {
        return Some(match &status.message {
            Some(message) => format!("{reason}: {message}"),
            None => reason.clone(),
        });
    }
    let init = status.init_container_statuses.iter().flatten();
    init.chain(status.container_statuses.iter().flatten()).find_map(|c| {
        let t = c.state.as_ref()?.terminated.as_ref()?;
        (t.exit_code != 0).then(|| {
            let why = t.reason.as_deref().unwrap_or("Error");
            format!("container {} exited {} ({why})", c.name, t.exit_code)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2026-01-01T00:01:00Z".parse().expect("time")
    }

    fn pod(value: serde_json::Value) -> WorkerPod {
        serde_json::from_value(value).expect("a pod")
    }

    #[test]
    fn past_rounds_train_and_eval_pods_are_pruned_the_newest_kept() {
        let worker = |kind: &str, round: u64, deleting: bool| {
            let mut metadata = json!({"name": format!("{kind}-{round}"), "labels": {WORKER_TYPE_LABEL: kind, ROUND_LABEL: round.to_string()}});
            if deleting {
                metadata["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            pod(json!({"metadata": metadata, "spec": {"containers": []}}))
        };
        let mut pods: Vec<WorkerPod> =
            (1..=5).flat_map(|r| [worker("train", r, false), worker("eval", r, false)]).collect();
        pods.push(worker("inference", 1, false));
        // Round 5 done, two kept: rounds 4 and 5 stay; an inference pod is never pruned here.
        let selector =
            |kept: &str| format!("{UID_LABEL}=u-1,{WORKER_TYPE_LABEL} in (train,eval),{ROUND_LABEL} notin ({kept})");
        assert_eq!(prune_selector(&pods, "u-1", 5, 2), Some(selector("4,5")));
        assert_eq!(prune_selector(&pods, "u-1", 5, 1), Some(selector("5")));
        assert_eq!(prune_selector(&pods, "u-1", 5, 0), None, "0 keeps every round");
        assert_eq!(prune_selector(&pods, "u-1", 2, 5), None);
        assert_eq!(prune_selector(&[worker("inference", 1, false)], "u-1", 5, 2), None, "inference is Deploy's");
        // Pods already being deleted are not asked for again; one left of round 2 is.
        let deleting: Vec<WorkerPod> = vec![worker("train", 1, true), worker("eval", 1, true)];
        assert_eq!(prune_selector(&deleting, "u-1", 4, 2), None);
        let deleting: Vec<WorkerPod> = deleting.into_iter().chain([worker("train", 2, false)]).collect();
        assert_eq!(prune_selector(&deleting, "u-1", 4, 2), Some(selector("3,4")));
    }

    #[test]
    fn a_deploy_replaces_the_inference_pod_and_prunes_past_rounds_in_one_request() {
        let worker = |kind: &str, round: u64, labelled: bool| {
            let mut labels = json!({WORKER_TYPE_LABEL: kind, ROUND_LABEL: round.to_string()});
            if labelled {
                labels[WORKER_ROUND_LABEL] = json!(format!("{kind}-{round}"));
            }
            pod(json!({"metadata": {"name": format!("{kind}-{round}"), "labels": labels}, "spec": {"containers": []}}))
        };
        let rounds = |labelled: bool| -> Vec<WorkerPod> {
            let mut pods: Vec<WorkerPod> =
                (1..=3).flat_map(|r| [worker("train", r, labelled), worker("eval", r, labelled)]).collect();
            pods.push(worker("inference", 2, labelled));
            pods
        };
        // Round 3 deploys, two rounds kept: round 2's inference pod and round 1's finished pods.
        let one = format!("{UID_LABEL}=u-1,{WORKER_ROUND_LABEL} in (eval-1,inference-2,train-1)");
        assert_eq!(deploy_deletions(&rounds(true), "u-1", 3, 2), [one]);
        assert_eq!(
            deploy_deletions(&rounds(true), "u-1", 3, 0),
            [format!("{UID_LABEL}=u-1,{WORKER_ROUND_LABEL} in (inference-2)")],
            "0 keeps every round"
        );
        // Pods of an older operator, without the label: the two requests as before.
        assert_eq!(
            deploy_deletions(&rounds(false), "u-1", 3, 2),
            [
                format!("{UID_LABEL}=u-1,{WORKER_TYPE_LABEL}=inference"),
                format!("{UID_LABEL}=u-1,{WORKER_TYPE_LABEL} in (train,eval),{ROUND_LABEL} notin (2,3)"),
            ]
        );
        // A first round: nothing to replace, nothing to prune, no request.
        assert!(deploy_deletions(&[worker("train", 1, true), worker("eval", 1, true)], "u-1", 1, 2).is_empty());
    }

    #[test]
    fn a_failed_stage_stops_its_worker_only_if_it_is_there_and_not_already_going() {
        let worker = |kind: &str, round: u64, deleting: bool| {
            let mut metadata = json!({"name": format!("{kind}-{round}"), "labels": {WORKER_TYPE_LABEL: kind, ROUND_LABEL: round.to_string()}});
            if deleting {
                metadata["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            pod(json!({"metadata": metadata, "spec": {"containers": []}}))
        };
        let first_round = [worker("train", 1, false), worker("eval", 1, false)];
        assert!(!any_to_stop(&[worker("train", 1, true)], Stage::Train, 1), "already being deleted");
        assert!(any_to_stop(&first_round, Stage::Train, 1));
        assert!(!any_to_stop(&first_round, Stage::Train, 2), "another round's train pod stays");
        assert!(!any_to_stop(&[], Stage::Eval, 1), "a vanished worker");
    }

    fn train_pod(name: &str, round: u64, created: &str, status: serde_json::Value) -> WorkerPod {
        pod(json!({
            "metadata": {
                "name": name,
                "creationTimestamp": created,
                "labels": {WORKER_TYPE_LABEL: "train", ROUND_LABEL: round.to_string()}
            },
            "spec": {"containers": [], "nodeName": "edge-1"},
            "status": status
        }))
    }

    #[test]
    fn picks_the_stage_and_round_and_the_newest() {
        let pods = vec![
            train_pod("old", 2, "2026-01-01T00:00:00Z", json!({"phase": "Failed"})),
            train_pod("new", 2, "2026-01-01T00:05:00Z", json!({"phase": "Running"})),
            train_pod("other-round", 3, "2026-01-01T00:09:00Z", json!({"phase": "Running"})),
        ];
        let seen = worker_of(&pods, Stage::Train, 2, now()).expect("a worker");
        assert_eq!((seen.name.as_str(), seen.phase), ("new", WorkerPhase::Running));
        assert_eq!(seen.node.as_deref(), Some("edge-1"));
        assert!(worker_of(&pods, Stage::Eval, 2, now()).is_none());
        assert!(worker_of(&pods, Stage::Train, 1, now()).is_none());
    }

    #[test]
    fn phases_restarts_and_finish_time() {
        let cases = [
            (json!({"phase": "Pending"}), WorkerPhase::Pending),
            (json!({"phase": "Unknown"}), WorkerPhase::Pending),
            (json!({}), WorkerPhase::Pending),
            (json!({"phase": "Running"}), WorkerPhase::Running),
            (json!({"phase": "Succeeded"}), WorkerPhase::Succeeded),
            (json!({"phase": "Failed"}), WorkerPhase::Failed),
        ];
        for (status, phase) in cases {
            let seen = observe(&train_pod("p", 1, "2026-01-01T00:00:00Z", status.clone()), Stage::Train, 1, now());
            assert_eq!(seen.phase, phase, "{status}");
        }
        let done = train_pod(
            "p",
            1,
            "2026-01-01T00:00:00Z",
            json!({"phase": "Succeeded", "containerStatuses": [
                {"name": "a", "restartCount": 2, "ready": false, "image": "i", "imageID": "",
                 "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-01-01T00:03:00Z"}}},
                {"name": "b", "restartCount": 1, "ready": false, "image": "i", "imageID": "",
                 "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-01-01T00:04:00Z"}}}
            ]}),
        );
        let seen = observe(&done, Stage::Train, 1, now());
        assert_eq!(seen.restarts, 3);
        assert_eq!(seen.finished_at, Some("2026-01-01T00:04:00Z".parse().expect("time")));
        // No container statuses: the creation time, so that the result grace still ends.
        let bare =
            observe(&train_pod("p", 1, "2026-01-01T00:00:00Z", json!({"phase": "Succeeded"})), Stage::Train, 1, now());
        assert_eq!(bare.finished_at, Some("2026-01-01T00:00:00Z".parse().expect("time")));
    }

    #[test]
    fn failures_say_why() {
        let evicted = train_pod(
            "p",
            1,
            "2026-01-01T00:00:00Z",
            json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}),
        );
        assert_eq!(observe(&evicted, Stage::Train, 1, now()).detail.as_deref(), Some("Evicted: low on memory"));
        let crashed = train_pod(
            "p",
            1,
            "2026-01-01T00:00:00Z",
            json!({"phase": "Failed", "containerStatuses": [
                {"name": "train", "restartCount": 0, "ready": false, "image": "i", "imageID": "",
                 "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
            ]}),
        );
        assert_eq!(
            observe(&crashed, Stage::Train, 1, now()).detail.as_deref(),
            Some("container train exited 137 (OOMKilled)")
        );
    }

    #[test]
    fn a_pod_stuck_on_its_image_or_config_fails_after_a_while_init_containers_count() {
        let stuck = train_pod(
            "p",
            1,
            "2026-01-01T00:00:00Z",
            json!({"phase": "Pending", "initContainerStatuses": [
                {"name": "storage-initializer", "restartCount": 2, "ready": false, "image": "i", "imageID": "",
                 "state": {"running": {}}}
            ], "containerStatuses": [
                {"name": "train", "restartCount": 0, "ready": false, "image": "i", "imageID": "",
                 "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
            ]}),
        );
        let early = observe(&stuck, Stage::Train, 1, now());
        assert_eq!((early.phase, early.restarts), (WorkerPhase::Pending, 2), "a pull may still succeed");
        let later = observe(&stuck, Stage::Train, 1, "2026-01-01T00:05:00Z".parse().expect("time"));
        assert_eq!(later.phase, WorkerPhase::Failed);
        assert_eq!(later.detail.as_deref(), Some("container train stuck in ImagePullBackOff: no such image"));
        let failed_init = train_pod(
            "p",
            1,
            "2026-01-01T00:00:00Z",
            json!({"phase": "Failed", "initContainerStatuses": [
                {"name": "storage-initializer", "restartCount": 0, "ready": false, "image": "i", "imageID": "",
                 "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
            ]}),
        );
        assert_eq!(
            observe(&failed_init, Stage::Train, 1, now()).detail.as_deref(),
            Some("container storage-initializer exited 2 (Error)")
        );
    }

    #[test]
    fn an_inference_pod_counts_once_ready_and_a_deleting_pod_is_waited_for() {
        let inference = |ready: &str, deleting: bool| {
            let mut value = json!({
                "metadata": {"name": "inf", "labels": {WORKER_TYPE_LABEL: "inference", ROUND_LABEL: "4"}},
                "spec": {"containers": []},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]}
            });
            if deleting {
                value["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            vec![pod(value)]
        };
        let phase = |pods: Vec<WorkerPod>| worker_of(&pods, Stage::Deploy, 4, now()).map(|w| w.phase);
        assert_eq!(phase(inference("False", false)), Some(WorkerPhase::Pending));
        assert_eq!(phase(inference("True", false)), Some(WorkerPhase::Running));
        assert_eq!(phase(inference("True", true)), Some(WorkerPhase::Pending));
    }
}
