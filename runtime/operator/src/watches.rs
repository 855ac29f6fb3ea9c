//! One watch per kind. The jobs, their Datasets and the jobs' pods are each watched once and
//! kept in a store, and every change goes two ways: to the Controller (which reconciles the
//! jobs it touches) and to the link (which updates the desired state of the nodes it touches).
//! Before, the Controller and the link each watched all three kinds.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::observe::UID_LABEL;
use super::scope::Scope;
use super::worker_pod::WorkerPod;
use super::written::WrittenJobs;
use perennial_api::{Dataset, LifelongLearningJob};

/// The three stores, filled by the watches.
#[derive(Clone)]
pub struct Stores {
    pub jobs: Store<LifelongLearningJob>,
    pub datasets: Store<Dataset>,
    pub pods: Store<WorkerPod>,
    /// The highest resourceVersion the pod watch has delivered (its store holds every change up
    /// to it): a pod created at or below it that the store lacks is gone (see `written`). Read
    /// with the store through [`Stores::pods_with_version`].
    pub pods_seen: Arc<AtomicU64>,
}

impl Stores {
    /// The pods stored, and a resourceVersion they are complete up to (`None` before the first
    /// event). The version is read first: the store holds everything up to it, so a snapshot
    /// taken after holds at least that. (The other way round, a pod stored between the two reads
    /// would be judged gone by a version past it, and created a second time.)
    pub fn pods_with_version(&self) -> (Vec<Arc<WorkerPod>>, Option<u64>) {
        let seen = self.pods_seen.load(Ordering::Acquire);
        (self.pods.state(), (seen > 0).then_some(seen))
    }
}

/// What the link hears: an object that changed (applied or deleted: the store says which), or
/// a kind listed whole (its store complete; after a restarted watch, objects may have gone
/// unseen). The link waits for the three `Listed` rather than on the stores' own readiness:
/// a store's `wait_until_ready` wakes only one waiter, and the Controller waits on it too.
#[derive(Clone, Debug)]
pub enum Seen {
    Job(Arc<LifelongLearningJob>),
    Dataset(Arc<Dataset>),
    Pod(Arc<WorkerPod>),
    Listed(Kind),
}

/// The three kinds watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Jobs,
    Datasets,
    Pods,
}

/// The Controller's triggers: each kind's touched objects.
pub struct Triggers {
    pub jobs: UnboundedReceiver<Result<LifelongLearningJob, watcher::Error>>,
    pub datasets: UnboundedReceiver<Result<Dataset, watcher::Error>>,
    pub pods: UnboundedReceiver<Result<WorkerPod, watcher::Error>>,
}

/// Starts the three watches over `scope` (pods: only the jobs', by Sedna's uid label). `link`
/// hears every change when the edge link runs; `written` each job version stored.
pub fn start(
    client: &Client,
    scope: &Scope,
    link: Option<UnboundedSender<Seen>>,
    written: &Arc<WrittenJobs>,
) -> (Stores, Triggers) {
    let all = watcher::Config::default();
    let shown = written.clone();
    let relisted = written.clone();
    let stored = Stored {
        trim: trim_job,
        then: move |job: &LifelongLearningJob| shown.shown(job),
        listed: move || relisted.relisted(),
    };
    let (job_store, job_triggers) =
        follow(client, scope, all.clone(), Kind::Jobs, link.clone(), Seen::Job, None, stored);
    written.follow(job_store.clone());
    let stored = Stored { trim: trim_meta, then: |_: &Dataset| {}, listed: || {} };
    let (dataset_store, dataset_triggers) =
        follow(client, scope, all, Kind::Datasets, link.clone(), Seen::Dataset, None, stored);
    let pods_seen = Arc::new(AtomicU64::new(0));
    let config = watcher::Config::default().labels(UID_LABEL);
    let stored = Stored { trim: trim_pod, then: |_: &WorkerPod| {}, listed: || {} };
    let (pod_store, pod_triggers) =
        follow(client, scope, config, Kind::Pods, link, Seen::Pod, Some(pods_seen.clone()), stored);
    let stores = Stores { jobs: job_store, datasets: dataset_store, pods: pod_store, pods_seen };
    (stores, Triggers { jobs: job_triggers, datasets: dataset_triggers, pods: pod_triggers })
}

/// managedFields and `kubectl apply`'s copy of the whole object (an annotation) are never read
/// here, and are often the biggest part of a stored object.
pub(crate) fn trim_meta<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// A job as the operator keeps it: its pod templates as compact text (see `stored_templates`).
pub(crate) fn trim_job(job: &mut LifelongLearningJob) {
    trim_meta(job);
    super::stored_templates::compact(job);
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A worker pod as the operator keeps it. Its spec (containers, env, volumes: most of a pod) and
/// the parts of its status it never reads are not in the type at all (`worker_pod`: deserialised
/// without them); what is left to drop: metadata, the conditions but Ready (the only one read),
/// and a finished container's termination message (up to 4 KiB; its reason and code say why).
pub(crate) fn trim_pod(pod: &mut WorkerPod) {
    trim_meta(pod);
    let Some(status) = pod.status.as_mut() else { return };
    if let Some(conditions) = status.conditions.as_mut() {
        conditions.retain(|condition| condition.type_ == "Ready");
    }
    let containers = status.container_statuses.iter_mut().chain(status.init_container_statuses.iter_mut());
    for container in containers.flatten() {
        if let Some(terminated) = container.state.as_mut().and_then(|state| state.terminated.as_mut()) {
            terminated.message = None;
        }
    }
}

/// What a watch does with each object: `trim` before it is stored, `then` once it is stored (a
/// change the watch delivered); `listed` once a (re)list's objects are stored.
struct Stored<K, F, L> {
    trim: fn(&mut K),
    then: F,
    listed: L,
}

/// One kind's watch, reflected into its store; each touched object sent on to the Controller
/// and the link, its resourceVersion to `version` (if tracked) once the store has it (a
/// list's objects: at the list's end, when the store takes them all). A watch error (RBAC, a
/// missing CRD) is said and retried with backoff.
#[allow(clippy::too_many_arguments)]
fn follow<K, F, L>(
    client: &Client,
    scope: &Scope,
    config: watcher::Config,
    kind: Kind,
    link: Option<UnboundedSender<Seen>>,
    seen: fn(Arc<K>) -> Seen,
    version: Option<Arc<AtomicU64>>,
    stored: Stored<K, F, L>,
) -> (Store<K>, UnboundedReceiver<Result<K, watcher::Error>>)
where
    F: Fn(&K) + Send + 'static,
    L: Fn() + Send + 'static,
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let (to_controller, triggers) = unbounded();
    // Stored as `trim` leaves it. Each namespace's watch retried with backoff on its own (scope.rs).
    let objects = scope.watch(client, config, store.clone()).modify(stored.trim);
    let events = reflector::reflector(writer, objects);
    let scope = scope.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut floor = VersionFloor::new(scope.version_keys());
        // A (re)list's highest versions: its objects reach the store together, at its end.
        let mut listing: HashMap<String, u64> = HashMap::new();
        while let Some(event) = events.next().await {
            let object = match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => {
                    // The reflector stored the object before handing it on.
                    if let (Some(version), Some(number)) = (&version, version_of(&object)) {
                        version.fetch_max(floor.saw(&scope.version_key(&object), number), Ordering::Release);
                    }
                    (stored.then)(&object);
                    object
                }
                Ok(watcher::Event::InitApply(object)) => {
                    let number = version_of(&object).unwrap_or(0);
                    let highest = listing.entry(scope.version_key(&object)).or_default();
                    *highest = (*highest).max(number);
                    object
                }
                Ok(watcher::Event::InitDone) => {
                    (stored.listed)();
                    for (key, number) in listing.drain() {
                        floor.saw(&key, number);
                    }
                    if let Some(version) = &version {
                        version.fetch_max(floor.lowest(), Ordering::Release);
                    }
                    if let Some(link) = &link {
                        let _ = link.unbounded_send(Seen::Listed(kind));
                    }
                    continue;
                }
                Ok(watcher::Event::Init) => {
                    listing.clear();
                    continue;
                }
                Err(err) => {
                    tracing::warn!("watching {kind:?}: {err}");
                    continue;
                }
            };
            if let Some(link) = &link {
                let _ = link.unbounded_send(seen(Arc::new(object.clone())));
            }
            if to_controller.unbounded_send(Ok(object)).is_err() && link.is_none() {
                return;
            }
        }
    });
    (store, triggers)
}

/// How far the watches have delivered, per namespace watched on its own (or for the one
/// cluster-wide watch): the store holds every change up to the lowest of them. (Per-namespace
/// watches go at their own pace; a version one has passed says nothing of another. A namespace
/// with nothing listed yet keeps the floor at 0: unknown, so a pod just created counts until its
/// watch shows it.)
struct VersionFloor {
    highest: HashMap<String, u64>,
}

impl VersionFloor {
    fn new(keys: Vec<String>) -> VersionFloor {
        VersionFloor { highest: keys.into_iter().map(|key| (key, 0)).collect() }
    }

    /// Notes `number` for `key`; the floor now.
    fn saw(&mut self, key: &str, number: u64) -> u64 {
        if let Some(highest) = self.highest.get_mut(key) {
            *highest = (*highest).max(number);
        }
        self.lowest()
    }

    fn lowest(&self) -> u64 {
        self.highest.values().copied().min().unwrap_or(0)
    }
}

/// An object's resourceVersion as a number (the API server's are etcd revisions).
fn version_of<K: Resource>(object: &K) -> Option<u64> {
    object.meta().resource_version.as_deref()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored worker pod (deserialised by the watch into the small type, then trimmed) keeps
    /// all the operator reads of it (its observation, its worker name for the edge) and none of
    /// what it never reads.
    #[test]
    fn a_trimmed_pod_is_observed_as_the_whole_one() {
        let value = serde_json::json!({
            "metadata": {
                "name": "job-train-x", "uid": "p1", "creationTimestamp": "2026-12-06T10:00:00Z",
                "labels": {UID_LABEL: "u1", "lifelonglearningjob.sedna.io/worker-type": "train",
                           perennial_workers::pod::ROUND_LABEL: "3"},
                "annotations": {LAST_APPLIED: "{...the whole object...}",
                                crate::reconcile::WORKER_NAME_ANNOTATION: "job-train-3"},
                "managedFields": [{"manager": "kubectl", "operation": "Update"}],
            },
            "spec": {"nodeName": "edge-1", "containers": [{"name": "train", "image": "worker:1",
                "env": [{"name": "BASE_MODEL_URL", "value": "s3://models/base"}]}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "train", "image": "worker:1",
                "imageID": "", "ready": true, "restartCount": 2, "state": {"running": {}}}]},
        });
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(value.clone()).expect("a pod");
        let whole = WorkerPod::from(pod.clone());
        let mut trimmed: WorkerPod = serde_json::from_value(value).expect("a worker pod");
        trim_pod(&mut trimmed);
        let now = jiff::Timestamp::now();
        for stage in [perennial_api::Stage::Train, perennial_api::Stage::Deploy] {
            assert_eq!(
                crate::observe::observe(&trimmed, stage, 3, now),
                crate::observe::observe(&whole, stage, 3, now)
            );
        }
        let seen = crate::observe::observe(&trimmed, perennial_api::Stage::Train, 3, now);
        assert_eq!((seen.name.as_str(), seen.restarts, seen.node.as_deref()), ("job-train-x", 2, Some("edge-1")));
        assert_eq!(seen.phase, perennial_lifecycle::WorkerPhase::Running);
        let worker = crate::node_state::worker_of_pod(&trimmed).expect("a worker");
        assert_eq!(worker.name, "job-train-3");
        assert_eq!(trimmed.metadata.labels, pod.metadata.labels);
        let annotations = trimmed.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), [crate::reconcile::WORKER_NAME_ANNOTATION]);
        assert!(trimmed.metadata.managed_fields.is_none());
        let kept = serde_json::to_value(&trimmed).expect("json");
        assert!(kept["spec"].get("containers").is_none(), "the containers are never read back");
        let spec = trimmed.spec.expect("its spec");
        assert_eq!(spec.node_name.as_deref(), Some("edge-1"));
    }

    /// Of the conditions only Ready stays, and a finished container keeps why it ended but not
    /// its termination message: the observation (Ready, its time, the failure's detail) is the
    /// same as the whole pod's.
    #[test]
    fn a_trimmed_pod_keeps_ready_and_why_its_container_ended() {
        let at = "2026-12-06T10:00:05Z";
        let conditions = serde_json::json!([
            {"type": "Initialized", "status": "True", "lastTransitionTime": at},
            {"type": "Ready", "status": "True", "lastTransitionTime": at},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": at},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": at},
        ]);
        let ended = serde_json::json!({"terminated": {"exitCode": 3, "reason": "Error", "finishedAt": at,
            "message": "x".repeat(4096)}});
        for phase in ["Running", "Failed"] {
            let value = serde_json::json!({
                "metadata": {"name": "job-eval-x", "uid": "p2", "creationTimestamp": "2026-12-06T10:00:00Z",
                    "labels": {UID_LABEL: "u1", "lifelonglearningjob.sedna.io/worker-type": "eval",
                               perennial_workers::pod::ROUND_LABEL: "3"}},
                "spec": {"nodeName": "edge-1"},
                "status": {"phase": phase, "conditions": conditions,
                    "containerStatuses": [{"name": "eval", "restartCount": 0, "state": ended}]},
            });
            let whole = WorkerPod::from(
                serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(value.clone()).expect("a pod"),
            );
            let mut trimmed: WorkerPod = serde_json::from_value(value).expect("a worker pod");
            trim_pod(&mut trimmed);
            let now = jiff::Timestamp::now();
            for stage in [perennial_api::Stage::Eval, perennial_api::Stage::Deploy] {
                assert_eq!(
                    crate::observe::observe(&trimmed, stage, 3, now),
                    crate::observe::observe(&whole, stage, 3, now),
                    "{phase} {stage}"
                );
            }
            let status = trimmed.status.expect("its status");
            let kept: Vec<&str> = status.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
            assert_eq!(kept, ["Ready"]);
            let state = status.container_statuses.iter().flatten().find_map(|c| c.state.clone()).expect("a state");
            let terminated = state.terminated.expect("terminated");
            assert_eq!(
                (terminated.exit_code, terminated.reason.as_deref(), terminated.message),
                (3, Some("Error"), None)
            );
        }
        let failed = crate::observe::observe(
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Failed",
                "containerStatuses": [{"name": "eval", "restartCount": 0, "state": ended}]}}))
            .expect("a worker pod"),
            perennial_api::Stage::Eval,
            3,
            jiff::Timestamp::now(),
        );
        assert_eq!(failed.detail.as_deref(), Some("container eval exited 3 (Error)"));
    }

    /// Per-namespace watches: the store is complete up to the lowest of their versions, and
    /// unknown (0) until each has shown one.
    #[test]
    fn the_floor_is_the_slowest_namespace() {
        let mut floor = VersionFloor::new(vec!["a".into(), "b".into()]);
        assert_eq!(floor.saw("a", 100), 0, "b has shown nothing yet");
        assert_eq!(floor.saw("b", 40), 40);
        assert_eq!(floor.saw("b", 120), 100);
        assert_eq!(floor.saw("a", 90), 100, "never back");
        assert_eq!(floor.saw("elsewhere", 500), 100, "a namespace not watched counts for nothing");
        let mut all = VersionFloor::new(vec![String::new()]);
        assert_eq!(all.saw("", 7), 7, "one cluster-wide watch");
    }
}
