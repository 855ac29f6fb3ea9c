//! What each edge node should hold, computed from the cluster's jobs, datasets and pods (pure):
//! the link sends it to the node as its desired state. A job lives on the node of its Dataset
//! (`spec.nodeName`), as in Sedna; it carries what the edge runs it with (its policies), the
//! stage the control plane moved it to (while it waits there), and the names of the workers
//! started for it (only they may report through the node's worker API).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kube::ResourceExt;
use serde_json::{Value, json};

use super::observe::{UID_LABEL, WORKER_TYPE_LABEL};
use super::reconcile::WORKER_NAME_ANNOTATION;
use super::worker_pod::WorkerPod;
use perennial_api::{Dataset, LifelongLearningJob, LifelongLearningJobStatus, Phase, Stage};
use perennial_link::cloud_server::NodeDesired;
use perennial_link::desired::DesiredObject;
use perennial_types::JobConfig;
use perennial_types::JobSpec;
use perennial_types::{NodeJob, NodeJobMeta, NodeWorker, StageNotice};
use perennial_workers::pod::ROUND_LABEL;

/// Every node's desired state, kept up to date object by object: a change to a job, a Dataset
/// or a pod recomputes the entries it touches, on the nodes they were and are on, and says
/// which nodes changed; the other nodes' state is not looked at.
#[derive(Debug, Default, PartialEq)]
pub struct DesiredNodes {
    nodes: BTreeMap<String, NodeDesired>,
    /// The node each job and dataset is on now (by key), so that a move or a deletion clears
    /// the old one.
    job_nodes: HashMap<String, String>,
    dataset_nodes: HashMap<String, String>,
}

impl DesiredNodes {
    /// From the whole cluster: at start, and after a watch listed a kind again.
    pub fn build(
        jobs: &[Arc<LifelongLearningJob>],
        datasets: &[Arc<Dataset>],
        pods: &[Arc<WorkerPod>],
    ) -> DesiredNodes {
        let mut nodes = DesiredNodes::default();
        for dataset in datasets {
            nodes.place_dataset(&perennial_api::key(&dataset.metadata), Some(dataset));
        }
        // Each job's Dataset and pods by index, not by a scan of every store per job: a takeover
        // at fleet size builds every node's state at once.
        let mut by_name: HashMap<(Option<String>, String), Arc<Dataset>> = HashMap::new();
        for dataset in datasets {
            by_name.insert((dataset.namespace(), dataset.name_any()), dataset.clone());
        }
        let mut by_job: HashMap<&str, Vec<Arc<WorkerPod>>> = HashMap::new();
        for pod in pods {
            if let Some(uid) = pod.labels().get(UID_LABEL) {
                by_job.entry(uid.as_str()).or_default().push(pod.clone());
            }
        }
        for job in jobs {
            let dataset = by_name.get(&(job.namespace(), job.spec.dataset.name.clone()));
            let own_pods = job.metadata.uid.as_deref().and_then(|uid| by_job.get(uid)).map_or(&[][..], Vec::as_slice);
            nodes.place_job(
                &perennial_api::key(&job.metadata),
                Some(job),
                dataset.map(std::slice::from_ref).unwrap_or(&[]),
                own_pods,
            );
        }
        nodes
    }

    /// The nodes that hold something, and what.
    pub fn nodes(&self) -> &BTreeMap<String, NodeDesired> {
        &self.nodes
    }

    /// What `node` holds now (nothing: an empty state).
    pub fn node(&self, node: &str) -> NodeDesired {
        self.nodes.get(node).cloned().unwrap_or_default()
    }

    /// Job `key` as it is now (`None`: deleted). Returns the nodes whose state changed.
    pub fn job_changed(
        &mut self,
        key: &str,
        job: Option<&Arc<LifelongLearningJob>>,
        datasets: &[Arc<Dataset>],
        pods: &[Arc<WorkerPod>],
    ) -> BTreeSet<String> {
        self.place_job(key, job, datasets, pods)
    }

    /// Dataset `key` as it is now (`None`: deleted), and the jobs that use it re-placed.
    /// Returns the nodes whose state changed.
    pub fn dataset_changed(
        &mut self,
        key: &str,
        dataset: Option<&Arc<Dataset>>,
        jobs: &[Arc<LifelongLearningJob>],
        datasets: &[Arc<Dataset>],
        pods: &[Arc<WorkerPod>],
    ) -> BTreeSet<String> {
        let mut changed = self.place_dataset(key, dataset);
        let Some((namespace, name)) = key.split_once('/') else { return changed };
        for job in jobs.iter().filter(|j| j.namespace().as_deref() == Some(namespace) && j.spec.dataset.name == name) {
            changed.extend(self.place_job(&perennial_api::key(&job.metadata), Some(job), datasets, pods));
        }
        changed
    }

    /// A pod of job `uid` changed (its workers): the job re-placed. Returns the nodes whose
    /// state changed.
    pub fn pod_changed(
        &mut self,
        uid: &str,
        jobs: &[Arc<LifelongLearningJob>],
        datasets: &[Arc<Dataset>],
        pods: &[Arc<WorkerPod>],
    ) -> BTreeSet<String> {
        match jobs.iter().find(|job| job.metadata.uid.as_deref() == Some(uid)) {
            Some(job) => self.place_job(&perennial_api::key(&job.metadata), Some(job), datasets, pods),
            None => BTreeSet::new(),
        }
    }

    fn place_dataset(&mut self, key: &str, dataset: Option<&Arc<Dataset>>) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        if let Some(old) = self.dataset_nodes.remove(key) {
            self.edit(&old, |desired| desired.datasets.remove(key).is_some(), &mut changed);
        }
        let dataset = dataset.filter(|d| !d.spec.node_name.is_empty() && d.metadata.deletion_timestamp.is_none());
        if let Some(dataset) = dataset {
            let object = json!({
                "metadata": {"namespace": dataset.namespace(), "name": dataset.name_any(), "uid": dataset.uid()},
                "spec": dataset.spec,
            });
            let node = dataset.spec.node_name.clone();
            self.edit(&node, |desired| set_if_changed(&mut desired.datasets, key, object), &mut changed);
            self.dataset_nodes.insert(key.to_owned(), node);
        }
        changed
    }

    fn place_job(
        &mut self,
        key: &str,
        job: Option<&Arc<LifelongLearningJob>>,
        datasets: &[Arc<Dataset>],
        pods: &[Arc<WorkerPod>],
    ) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        let placed = job.and_then(|job| {
            let namespace = job.namespace();
            let dataset =
                datasets.iter().find(|d| d.namespace() == namespace && d.name_any() == job.spec.dataset.name)?;
            let object = serde_json::to_value(node_job(job, dataset, pods)?).ok()?;
            Some((dataset.spec.node_name.clone(), object))
        });
        let old = self.job_nodes.remove(key);
        if let Some(old) = old.filter(|old| placed.as_ref().is_none_or(|(node, _)| node != old)) {
            self.edit(&old, |desired| desired.jobs.remove(key).is_some(), &mut changed);
        }
        if let Some((node, object)) = placed {
            self.edit(&node, |desired| set_if_changed(&mut desired.jobs, key, object), &mut changed);
            self.job_nodes.insert(key.to_owned(), node);
        }
        changed
    }

    /// Edits `node`'s state; a node left with nothing is dropped.
    fn edit(&mut self, node: &str, edit: impl FnOnce(&mut NodeDesired) -> bool, changed: &mut BTreeSet<String>) {
        let desired = self.nodes.entry(node.to_owned()).or_default();
        if edit(desired) {
            changed.insert(node.to_owned());
        }
        if desired.jobs.is_empty() && desired.datasets.is_empty() {
            self.nodes.remove(node);
        }
    }
}

/// Holds `object` at `key`; false, keeping the copy held (and shared), when it is the same.
fn set_if_changed(objects: &mut BTreeMap<String, DesiredObject>, key: &str, object: Value) -> bool {
    let object = DesiredObject::new(&object);
    if objects.get(key).is_some_and(|held| *held == object) {
        return false;
    }
    objects.insert(key.to_owned(), object);
    true
}

/// The job as its node runs it; `None` for a job no node should run: being deleted, or whose
/// Dataset names no node or is being deleted. A job edited into something the operator refuses
/// stays (the edge would otherwise forget its rounds): its node keeps running it, and a policy
/// reference that does not load is refused there, the previous policy serving on.
pub fn node_job(job: &LifelongLearningJob, dataset: &Dataset, pods: &[Arc<WorkerPod>]) -> Option<NodeJob> {
    if job.metadata.deletion_timestamp.is_some()
        || dataset.spec.node_name.is_empty()
        || dataset.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let (namespace, name, uid) = (job.namespace().unwrap_or_default(), job.name_any(), job.uid()?);
    let key = format!("{namespace}/{name}");
    let spec = JobSpec {
        dataset: format!("{namespace}/{}", dataset.name_any()),
        dataset_url: dataset.spec.url.clone(),
        dataset_format: dataset.spec.format.to_ascii_lowercase(),
        output_dir: job.spec.output_dir.clone(),
        train_prob: job.spec.dataset.train_prob,
        eval_set_size: job.spec.eval_spec.eval_set_size,
        decision_records: job.spec.decision_records,
    };
    let config = JobConfig {
        name: key,
        uid: uid.clone(),
        spec,
        splitter: job.spec.dataset.split_policy.clone(),
        trigger: job.spec.trigger_policy(),
        selector: job.spec.select_policy(),
        fallback_trigger: job.spec.fallback_trigger(),
        policy_artifacts: Default::default(),
        registry_auth: Default::default(),
    };
    let mut workers: Vec<NodeWorker> = pods
        .iter()
        .filter(|pod| pod.labels().get(UID_LABEL) == Some(&uid))
        .filter_map(|pod| worker_of_pod(pod))
        .collect();
    workers.sort_by(|a, b| a.name.cmp(&b.name));
    Some(NodeJob {
        metadata: NodeJobMeta { namespace, name, uid },
        config,
        notice: job.status.as_ref().and_then(notice_of),
        workers,
    })
}

/// The stage the job waits in on the edge, while it waits: the notice the embedded mode hands
/// the edge directly. After a failed round the job waits in Train with `retries` counted, and
/// the round's train samples go back to the next one.
pub fn notice_of(status: &LifelongLearningJobStatus) -> Option<StageNotice> {
    let stage = status.stage?;
    if status.phase? != Phase::Waiting {
        return None;
    }
    Some(StageNotice { stage, round: status.round, failed: stage == Stage::Train && status.retries > 0 })
}

/// The worker a pod runs: its `WORKER_NAME`, round and stage (Sedna's worker type).
pub fn worker_of_pod(pod: &WorkerPod) -> Option<NodeWorker> {
    let name = pod.annotations().get(WORKER_NAME_ANNOTATION)?.clone();
    let round = pod.labels().get(ROUND_LABEL)?.parse().ok()?;
    let stage = match pod.labels().get(WORKER_TYPE_LABEL)?.as_str() {
        "train" => Stage::Train,
        "eval" => Stage::Eval,
        "inference" => Stage::Deploy,
        _ => return None,
    };
    Some(NodeWorker { name, round, stage })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use perennial_api::JobCondition;

    const UID: &str = "uid-1";

    fn job(name: &str, dataset: &str, status: Value) -> Arc<LifelongLearningJob> {
        let template = json!({"spec": {"containers": [{"name": "w", "image": "sedna/w:v1"}]}});
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob",
                "metadata": {"name": name, "namespace": "ml", "uid": format!("{UID}-{name}")},
                "spec": {
                    "dataset": {"name": dataset, "trainProb": 0.8},
                    "trainSpec": {"template": template, "trigger": {"checkPeriodSeconds": 60,
                        "condition": {"operator": ">", "threshold": 100, "metric": "num_of_samples"}}},
                    "evalSpec": {"template": template},
                    "deploySpec": {"template": template},
                    "outputDir": "/output/thermal"
                },
                "status": status
            }))
            .expect("job"),
        )
    }

    fn dataset(name: &str, node: &str) -> Arc<Dataset> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "sedna.io/v1alpha1", "kind": "Dataset",
                "metadata": {"name": name, "namespace": "ml", "uid": format!("d-{name}")},
                "spec": {"url": format!("/data/{name}/index.txt"), "format": "TXT", "nodeName": node},
                "status": {"numberOfSamples": 42}
            }))
            .expect("dataset"),
        )
    }

    fn pod(job_uid: &str, kind: &str, round: &str, worker: Option<&str>) -> Arc<WorkerPod> {
        let mut metadata = json!({"name": format!("p-{kind}-{round}"), "namespace": "ml", "labels": {
            UID_LABEL: job_uid, WORKER_TYPE_LABEL: kind, ROUND_LABEL: round}});
        if let Some(worker) = worker {
            metadata["annotations"] = json!({WORKER_NAME_ANNOTATION: worker});
        }
        Arc::new(serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata})).expect("pod"))
    }

    #[test]
    fn each_node_holds_the_jobs_of_its_datasets_with_their_workers() {
        let jobs = [job("a", "d1", Value::Null), job("b", "d2", Value::Null), job("c", "missing", Value::Null)];
        let datasets = [dataset("d1", "edge-1"), dataset("d2", "edge-2"), dataset("d3", "")];
        let pods = [
            pod("uid-1-a", "train", "1", Some("train-worker-1")),
            pod("uid-1-a", "inference", "0", Some("inferworker-0")),
            pod("uid-1-a", "eval", "1", None),
            pod("uid-1-b", "train", "1", Some("train-worker-b")),
        ];
        let built = DesiredNodes::build(&jobs, &datasets, &pods);
        let nodes = built.nodes();
        assert_eq!(nodes.keys().collect::<Vec<_>>(), ["edge-1", "edge-2"], "a dataset with no node is on none");
        let edge1 = &nodes["edge-1"];
        assert_eq!(edge1.jobs.keys().collect::<Vec<_>>(), ["ml/a"]);
        assert_eq!(edge1.datasets.keys().collect::<Vec<_>>(), ["ml/d1"]);
        assert!(edge1.datasets["ml/d1"].value().get("status").is_none(), "a count change is no desired change");
        let a: NodeJob = serde_json::from_value(edge1.jobs["ml/a"].value()).expect("a node job");
        assert_eq!(a.metadata, NodeJobMeta { namespace: "ml".into(), name: "a".into(), uid: "uid-1-a".into() });
        assert_eq!(a.config.name, "ml/a");
        assert_eq!(a.config.spec.dataset, "ml/d1");
        assert_eq!(a.config.spec.dataset_url, "/data/d1/index.txt");
        assert_eq!(a.config.spec.dataset_format, "txt");
        assert_eq!(a.config.spec.output_dir, "/output/thermal");
        assert_eq!(a.config.trigger.plugin, "builtin:threshold-trigger", "Sedna's trigger, as the edge runs it");
        let workers: Vec<(&str, i64, &str)> =
            a.workers.iter().map(|w| (w.name.as_str(), w.round, w.stage.report_kind())).collect();
        assert_eq!(workers, [("inferworker-0", 0, "deploy"), ("train-worker-1", 1, "train")]);
        assert_eq!(a.notice, None, "no status yet: the edge starts in Train itself");
    }

    #[test]
    fn deleted_jobs_leave_their_node_and_refused_edits_do_not() {
        let deleted = || Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let mut deleting = (*job("a", "d1", Value::Null)).clone();
        deleting.metadata.deletion_timestamp = deleted();
        let mut refused = (*job("b", "d1", Value::Null)).clone();
        refused.spec.train_spec.trigger.as_mut().expect("a trigger").check_period_seconds = Some(-1);
        assert!(perennial_api::validate_job(&refused, &|_| true).is_err(), "the operator refuses it");
        let mut going = (*dataset("d2", "edge-1")).clone();
        going.metadata.deletion_timestamp = deleted();
        let jobs = [Arc::new(deleting), Arc::new(refused), job("c", "d2", Value::Null)];
        let built = DesiredNodes::build(&jobs, &[dataset("d1", "edge-1"), Arc::new(going)], &[]);
        let nodes = built.nodes();
        assert_eq!(nodes["edge-1"].jobs.keys().collect::<Vec<_>>(), ["ml/b"], "kept: its node keeps its rounds");
        assert_eq!(nodes["edge-1"].datasets.keys().collect::<Vec<_>>(), ["ml/d1"]);
    }

    #[test]
    fn the_edge_is_told_the_stage_only_while_the_job_waits_in_it() {
        let status = |stage: Stage, phase: Phase, round: u64, retries: u32| LifelongLearningJobStatus {
            stage: Some(stage),
            phase: Some(phase),
            round,
            retries,
            conditions: Vec::<JobCondition>::new(),
            ..Default::default()
        };
        let notice = |stage: Stage, round: u64, failed: bool| Some(StageNotice { stage, round, failed });
        let cases = [
            (status(Stage::Train, Phase::Waiting, 0, 0), notice(Stage::Train, 0, false)),
            (status(Stage::Eval, Phase::Waiting, 1, 0), notice(Stage::Eval, 1, false)),
            (status(Stage::Deploy, Phase::Waiting, 2, 0), notice(Stage::Deploy, 2, false)),
            (status(Stage::Train, Phase::Waiting, 3, 1), notice(Stage::Train, 3, true)),
            (status(Stage::Eval, Phase::Waiting, 3, 1), notice(Stage::Eval, 3, false)),
            (status(Stage::Train, Phase::Running, 3, 0), None),
            (status(Stage::Deploy, Phase::Completed, 3, 0), None),
            (LifelongLearningJobStatus::default(), None),
        ];
        for (status, expected) in cases {
            assert_eq!(notice_of(&status), expected, "{:?}/{:?} round {}", status.stage, status.phase, status.round);
        }
    }

    #[test]
    fn a_pod_is_a_worker_only_with_its_name_round_and_type() {
        let cases = [
            (pod("u", "train", "2", Some("train-worker-x")), Some(("train-worker-x", 2, "train"))),
            (pod("u", "eval", "2", Some("eval-worker-x")), Some(("eval-worker-x", 2, "eval"))),
            (pod("u", "inference", "2", Some("inferworker-x")), Some(("inferworker-x", 2, "deploy"))),
            (pod("u", "train", "2", None), None),
            (pod("u", "train", "two", Some("train-worker-x")), None),
            (pod("u", "sidecar", "2", Some("x")), None),
        ];
        for (pod, expected) in cases {
            let found = worker_of_pod(&pod);
            let found = found.as_ref().map(|w| (w.name.as_str(), w.round, w.stage.report_kind()));
            assert_eq!(found, expected, "{:?}", pod.metadata.labels);
        }
    }

    #[test]
    fn a_change_touches_only_its_nodes_and_ends_where_a_full_build_does() {
        let mut jobs = vec![job("a", "d1", Value::Null), job("b", "d2", Value::Null)];
        let mut datasets = vec![dataset("d1", "edge-1"), dataset("d2", "edge-2")];
        let mut pods: Vec<Arc<WorkerPod>> = Vec::new();
        let mut desired = DesiredNodes::build(&jobs, &datasets, &pods);
        let nodes = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();

        // A worker of job a: only edge-1 is told.
        pods.push(pod("uid-1-a", "train", "1", Some("train-worker-1")));
        assert_eq!(desired.pod_changed("uid-1-a", &jobs, &datasets, &pods), nodes(&["edge-1"]));
        // Nothing new: nobody is told.
        assert_eq!(desired.pod_changed("uid-1-a", &jobs, &datasets, &pods), nodes(&[]));
        // Job b moves to d1: it leaves edge-2 (which then holds only its dataset) for edge-1.
        jobs[1] = job("b", "d1", Value::Null);
        assert_eq!(desired.job_changed("ml/b", Some(&jobs[1]), &datasets, &pods), nodes(&["edge-1", "edge-2"]));
        // Dataset d1 moves to edge-3, with both its jobs.
        datasets[0] = dataset("d1", "edge-3");
        assert_eq!(
            desired.dataset_changed("ml/d1", Some(&datasets[0]), &jobs, &datasets, &pods),
            nodes(&["edge-1", "edge-3"])
        );
        assert!(!desired.nodes().contains_key("edge-1"), "a node left with nothing is dropped");
        assert_eq!(desired, DesiredNodes::build(&jobs, &datasets, &pods));
        // Job a deleted; dataset d2 deleted.
        jobs.remove(0);
        assert_eq!(desired.job_changed("ml/a", None, &datasets, &pods), nodes(&["edge-3"]));
        datasets.remove(1);
        assert_eq!(desired.dataset_changed("ml/d2", None, &jobs, &datasets, &pods), nodes(&["edge-2"]));
        assert_eq!(desired, DesiredNodes::build(&jobs, &datasets, &pods));
        assert_eq!(desired.nodes().keys().collect::<Vec<_>>(), ["edge-3"]);
        assert_eq!(desired.node("edge-3").jobs.keys().collect::<Vec<_>>(), ["ml/b"]);
    }
}
