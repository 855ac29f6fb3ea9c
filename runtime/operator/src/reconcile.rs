//! The reconciler: one LifelongLearningJob at a time, the shared stage machine over what the API
//! server says (the job's status, its pods listed by uid) and the edge's waiting reports; the
//! new status written first, in one merge patch under the resourceVersion read (retried on a
//! conflict from the job as the watch shows it next), then its actions carried out (pods created
//! or deleted, one Event per round and stage).
//!
//! Writing the status before acting makes a crash between the two safe: the next reconcile
//! finds the stage Starting with no pod and starts it again (counted), and a status write that
//! lost a race never acts at all. Pods and Datasets are read from the operator's own watches
//! (no API call), with the pods created here that they may not show yet (`written`), so a pod
//! just created is never taken for a vanished one. Events go out off this path (`events`).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::events::Events;
use super::inbox::Inbox;
use super::observe::{self, UID_LABEL, WORKER_TYPE_LABEL};
use super::patch;
use super::pod_name::{Start, worker_pod_name};
use super::running_hold;
use super::stored_templates;
use super::watches::Stores;
use super::worker_pod::WorkerPod;
use perennial_api::{Dataset, JobCondition, LifelongLearningJob, LifelongLearningJobStatus, Phase, Stage};
use perennial_lifecycle::{self as lifecycle, Action, JobView, Observations, Settings, WorkerSpec};
use perennial_workers::pod::{Credential, PodContext, ROUND_LABEL, build_pod, endpoint_url};

/// Holds a job until its pods are removed and its edge is told (`kubectl delete` waits for it).
pub const FINALIZER: &str = "lifelonglearningjob.perennial.io/cleanup";
/// The worker name a pod was given (`WORKER_NAME`): the link tells the job's edge, whose worker
/// API accepts reports only from names it was told.
pub const WORKER_NAME_ANNOTATION: &str = "perennial.io/worker-name";
/// How often a job is looked at when nothing happens.
const RESYNC: Duration = Duration::from_secs(300);
/// Status writes tried before giving up for this reconcile (each after a fresh read).
const STATUS_TRIES: usize = 5;
/// How long a status write refused as a conflict waits for the job watch to show the write it
/// lost to, before reading the job from the API server instead.
const WATCH_CATCH_UP: Duration = Duration::from_secs(1);
/// How long a status change that takes a train result waits for the Eval Ready its edge sends
/// right after it (`next_follows`), counted from the result's arrival: both then go in one
/// write. An edge that sends nothing more (its eval step failed) costs this much delay once.
const NEXT_REPORT_WAIT: Duration = Duration::from_secs(2);

/// What worker pods are made with, beyond the job.
#[derive(Clone, Debug)]
pub struct WorkerDefaults {
    /// The edge agent's worker API as workers reach it (host network): Sedna's `LC_SERVER`.
    pub lc_server: String,
    pub kb_server: String,
    /// The operator's own image, whose `perennial fetch` downloads remote inputs.
    pub fetch_image: String,
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub workers: WorkerDefaults,
    pub inbox: Arc<Inbox>,
    /// The jobs, Datasets and pods as the operator's watches have them.
    pub stores: Stores,
    pub events: Events,
    pub metrics: Arc<super::metrics::Metrics>,
    /// Failed reconciles in a row, per job (`namespace/name`): the error backoff.
    pub failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// The pods created here that the pod store may not show yet.
    pub written: super::written::WrittenPods,
    /// The jobs' statuses as written here (reconciles and the link), which the job store may
    /// not show yet.
    pub written_jobs: Arc<super::written::WrittenJobs>,
    /// Rounds whose finished Train and Eval pods are kept, the newest (0: all).
    pub finished_rounds_kept: u64,
    /// Above this many worker pods in a namespace, pods are deleted by name
    /// ([`DELETE_BY_NAME_PAST_PODS`]).
    pub delete_by_name_past: usize,
    /// The jobs' registry logins from their `imagePullSecrets`, read on each reconcile.
    pub pull_secrets: Arc<super::pull_secrets::PullSecrets>,
    /// The workers' Running not written yet, each held a moment for a result to take it along.
    pub running_holds: super::running_hold::RunningHolds,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} for {object}: {source}")]
    Kube { what: &'static str, object: String, source: Box<kube::Error> },
    #[error("{0}: the status changed under each of {STATUS_TRIES} writes; trying again later")]
    Conflicts(String),
    /// The job's Dataset is not in the operator's watch (deleted, or not made yet).
    #[error("{job}: no Dataset {dataset:?} in its namespace; the job waits for it")]
    DatasetMissing { job: String, dataset: String },
    /// A Secret the job (or its Dataset) names that the operator will not or may not read.
    #[error("{0}")]
    Credential(String),
    /// Not a fault: the job's finalizer waits until its pods, being deleted, are gone.
    #[error("{job}: {pods} of its pods still terminating; the job goes once they are gone")]
    PodsTerminating { job: String, pods: usize },
}

impl Error {
    /// The metric label of the error.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube { what, .. } => what,
            Error::Conflicts(_) => "status_conflicts",
            Error::Credential(_) => "credential",
            Error::DatasetMissing { .. } => "read_dataset",
            Error::PodsTerminating { .. } => "pods_terminating",
        }
    }

    /// A wait, not a failure: no error counted, no backoff.
    fn is_wait(&self) -> bool {
        matches!(self, Error::PodsTerminating { .. })
    }
}

fn kube_error<'a>(what: &'static str, object: &'a str) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |source| Error::Kube { what, object: object.to_owned(), source: Box::new(source) }
}

/// Reconciles one job (kube's `Controller` calls it on every change of the job or its pods,
/// and when the edge has reports for it).
pub async fn reconcile(job: Arc<LifelongLearningJob>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    ctx.metrics.reconciles.inc();
    let (namespace, key) = (namespace_of(&job), perennial_api::key(&job.metadata));
    let jobs: Api<LifelongLearningJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let outcome = with_finalizer(&jobs, job, &ctx, &key).await;
    if outcome.is_ok() {
        ctx.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&key);
    }
    outcome
}

/// kube's finalizer flow (the job applied while it holds the finalizer, cleaned up and released
/// once deleted), except that the finalizer is added by a server-side apply. That is idempotent:
/// a cached copy that does not show the finalizer yet (the watch behind, thousands of jobs made at
/// once) costs one write that changes nothing, where kube's conditional JSON patch is refused
/// (422) and retried until the cache catches up. The job is then applied at once from the object
/// the write returns, not on another turn.
async fn with_finalizer(
    jobs: &Api<LifelongLearningJob>,
    job: Arc<LifelongLearningJob>,
    ctx: &Context,
    key: &str,
) -> Result<Requeue, Error> {
    let name = job.name_any();
    let ours = job.finalizers().iter().position(|finalizer| finalizer == FINALIZER);
    match (ours, job.metadata.deletion_timestamp.is_some()) {
        (Some(_), false) => {
            // Stored with its pod templates compact: validated and made into pods here.
            let job = stored_templates::restored_arc(job).map_err(|err| Error::Kube {
                what: "stored_templates",
                object: key.to_owned(),
                source: Box::new(kube::Error::SerdeError(err)),
            })?;
            apply(&job, ctx).await
        }
        (None, false) => {
            let apply_finalizer = json!({
                "apiVersion": LifelongLearningJob::api_version(&()),
                "kind": LifelongLearningJob::kind(&()),
                "metadata": { "name": name, "finalizers": [FINALIZER] },
            });
            let params = PatchParams::apply(FINALIZER_MANAGER);
            let fresh = match jobs.patch(&name, &params, &Patch::Apply(&apply_finalizer)).await {
                Ok(fresh) => fresh,
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Requeue::await_change()),
                Err(err) => return Err(kube_error("finalizer", key)(err)),
            };
            if fresh.metadata.deletion_timestamp.is_some() {
                return Ok(Requeue::await_change()); // being deleted meanwhile: its event comes
            }
            apply(&fresh, ctx).await
        }
        (Some(index), true) => {
            let requeue = cleanup(&job, ctx).await?;
            // `test` first: the index is from this copy; another controller's finalizer is never
            // removed in ours' place (a refusal brings a fresh copy and another turn).
            let path = format!("/metadata/finalizers/{index}");
            let release = serde_json::from_value(json!([
                { "op": "test", "path": path, "value": FINALIZER },
                { "op": "remove", "path": path },
            ]))
            .map_err(|err| kube_error("finalizer", key)(kube::Error::SerdeError(err)))?;
            match jobs.patch(&name, &PatchParams::default(), &Patch::Json::<()>(release)).await {
                Ok(_) => Ok(requeue),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(Requeue::await_change()),
                Err(err) => Err(kube_error("finalizer", key)(err)),
            }
        }
        (None, true) => Ok(Requeue::await_change()),
    }
}

/// The field manager of the finalizer's server-side apply (it owns that list entry alone).
const FINALIZER_MANAGER: &str = "perennial-operator-finalizer";

/// The job's namespace (`default` when left out, as `api::key` says).
fn namespace_of(job: &LifelongLearningJob) -> String {
    job.namespace().unwrap_or_else(|| "default".into())
}

/// After an error: counted, logged, tried again after a while.
pub fn error_policy(job: Arc<LifelongLearningJob>, error: &Error, ctx: Arc<Context>) -> Requeue {
    let key = perennial_api::key(&job.metadata);
    if error.is_wait() {
        // The pods' deletions wake the job; this is only in case a watch event is missed.
        tracing::debug!(job = key, "{error}");
        return Requeue::requeue(Duration::from_secs(10));
    }
    ctx.metrics.error(error.kind());
    tracing::warn!(job = key, "{error}");
    // 5 s doubling to 5 min while the job keeps failing, so a lasting error (RBAC, a missing
    // subresource) does not hammer the API server.
    let mut failures = ctx.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let count = failures.entry(key).or_insert(0);
    *count = count.saturating_add(1);
    let wait = Duration::from_secs(5).saturating_mul(1 << (*count - 1).min(6)).min(Duration::from_secs(300));
    Requeue::requeue(wait)
}

/// The stage machine's view of the job's spec.
pub fn job_view(job: &LifelongLearningJob) -> JobView {
    let spec = &job.spec;
    let timeouts = [spec.train_spec.timeout_seconds, spec.eval_spec.timeout_seconds, spec.deploy_spec.timeout_seconds]
        .map(|t| t.map(Duration::from_secs));
    JobView { uid: job.metadata.uid.clone().unwrap_or_default(), timeouts }
}

/// The job's pods (by its uid label) from the pod store, with those created here that it does
/// not show yet.
fn job_pods(ctx: &Context, uid: &str) -> Vec<WorkerPod> {
    let (stored, version) = ctx.stores.pods_with_version();
    let pods = stored
        .iter()
        .filter(|pod| {
            pod.metadata.labels.as_ref().and_then(|labels| labels.get(UID_LABEL)).map(String::as_str) == Some(uid)
        })
        .map(|pod| pod.as_ref().clone())
        .collect();
    ctx.written.with_created(uid, pods, version)
}

async fn apply(job: &LifelongLearningJob, ctx: &Context) -> Result<Requeue, Error> {
    let (namespace, name, key) = (namespace_of(job), job.name_any(), perennial_api::key(&job.metadata));
    let jobs: Api<LifelongLearningJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let view = job_view(job);
    // The CRD's schema refuses most bad input; what it cannot check (policy references, a
    // trigger's window...) waits here for an edit, said once per change on the job.
    if let Err(errors) = perennial_api::validate_job(job, &|_| true) {
        ctx.metrics.error("invalid_spec");
        ctx.events.publish(&job.object_ref(&()), true, "InvalidSpec", "Validate".into(), errors.to_string());
        // On the status too, where `kubectl get ll -o yaml` and scripts look.
        set_refusal(&jobs, job, ctx, Some(format!("{REFUSED}{errors}")), &key).await?;
        return Ok(Requeue::await_change());
    }
    // Edited into a valid job: the former refusal goes.
    set_refusal(&jobs, job, ctx, None, &key).await?;
    refresh_pull_secrets(job, ctx, &namespace, &key).await;

    let reports = ctx.inbox.peek(&namespace, &name);
    // The job comes from the watch's store (or as last written here, if the store is behind),
    // which may still lag. A status made from a stale one is refused (the patch carries the
    // resourceVersion read) and made again from the watch's once it shows the write it lost to
    // (a fresh read if it does not within a second); a report that changes nothing
    // against it is judged again against a fresh read too, as one judged stale against an old
    // status would be acknowledged and lost.
    let mut current = ctx.written_jobs.newest(job);
    let mut read_fresh_once = false;
    let mut listed = job_pods(ctx, &view.uid);
    let mut pods_read = false;

    let mut tries = 0;
    let (before, step) = loop {
        let status = current.status.clone().unwrap_or_default();
        let stage = status.stage.unwrap_or(Stage::Train);
        let now = Timestamp::now();
        let worker = observe::worker_of(&listed, stage, status.round, now);
        let observed = Observations { reports: reports.clone(), worker };
        let step = lifecycle::step(&view, &status, &observed, now, &ctx.settings);
        // A worker the pod store lacks is made again only once a read of the job's pods agrees
        // that it is gone: a store behind, or a pod created here and forgotten, would have it
        // made twice. (Rare: a read only when a worker seems to have vanished.)
        if !pods_read && step.worker_gone {
            pods_read = true;
            listed = read_pods(ctx, &namespace, &view.uid, &key).await?;
            continue;
        }
        let old = serde_json::to_value(&status).unwrap_or_default();
        let new = serde_json::to_value(&step.status).unwrap_or_default();
        let version = current.metadata.resource_version.clone().unwrap_or_default();
        let Some(body) = patch::status_patch(&version, &old, &new) else {
            if reports.is_empty() || read_fresh_once {
                break (status, step);
            }
            read_fresh_once = true;
            let Some(fresh) = read_fresh(&jobs, &name, &view.uid, &key).await? else {
                return Ok(Requeue::await_change()); // deleted meanwhile
            };
            current = fresh;
            continue;
        };
        if let Some(wait) = next_report_wait(&reports, &step.status, ctx.inbox.waited(&namespace, &name)) {
            // Unwritten and unacknowledged: the edge keeps the result until the write that takes it.
            return Ok(Requeue::requeue(wait));
        }
        if running_hold::running_alone(&status, &step.status, !reports.is_empty(), !step.actions.is_empty()) {
            let waited = ctx.running_holds.waited(&key, step.status.round, stage);
            if let Some(rest) = running_hold::rest_of_hold(waited) {
                return Ok(Requeue::requeue(rest));
            }
        }
        match jobs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body)).await {
            Ok(written) => {
                ctx.written_jobs.wrote(written);
                ctx.running_holds.forget(&key);
                break (status, step);
            }
            Err(kube::Error::Api(status)) if status.is_conflict() && tries + 1 < STATUS_TRIES => {
                tries += 1;
                // The write it lost to reaches the watch in a moment: no read needed.
                if let Some(newer) = newer_from_watch(ctx, job, &version).await {
                    tracing::debug!(job = key, "the status changed since it was read; stepping again from the watch's");
                    current = newer;
                    continue;
                }
                read_fresh_once = true;
                tracing::debug!(job = key, "the status changed since it was read; reading it again");
                let Some(fresh) = read_fresh(&jobs, &name, &view.uid, &key).await? else {
                    return Ok(Requeue::await_change()); // deleted meanwhile
                };
                current = fresh;
            }
            Err(kube::Error::Api(status)) if status.is_conflict() => return Err(Error::Conflicts(key)),
            Err(err) => return Err(kube_error("patch_status", &key)(err)),
        }
    };
    // Durable now: the edge may drop these from its outbox.
    ctx.inbox.applied(&namespace, &name, reports.len());

    let reference = job.object_ref(&());
    let mut previous = before.conditions.last();
    let added = added_conditions(&before, &step.status);
    for condition in added {
        ctx.metrics.transition(&condition.stage.to_string(), &condition.type_.to_string());
        if let Some((reason, note)) = condition_event(condition, previous, &step.status) {
            let action = format!("Round{}{}", step.status.round, condition.stage);
            ctx.events.publish(&reference, false, reason, action, note);
        }
        previous = Some(condition);
    }
    for action in &step.actions {
        // A stage's first worker of the round (its Starting just added) is the stage's Event.
        let first = matches!(action, Action::StartWorker(spec)
            if added.iter().any(|c| c.stage == spec.stage && c.type_ == Phase::Starting));
        act(job, ctx, &reference, action, &step.status, first, &listed).await?;
    }
    // A round that deployed pruned with its inference pod's replacement; one that did not (the
    // selector chose no model) prunes now.
    let deployed = step.status.deployed.as_ref().is_some_and(|d| d.round == step.status.round);
    if step.status.rounds_completed > before.rounds_completed && !deployed {
        prune_finished_pods(ctx, &namespace, &view.uid, &listed, step.status.round, &key).await;
    }
    Ok(match step.recheck_after {
        Some(after) => Requeue::requeue(after.min(RESYNC)),
        None => Requeue::requeue(RESYNC),
    })
}

/// The rest of the wait for the next stage's Ready, when the step's last report is a stage
/// result its edge follows with it (`next_follows`) and the job now waits in that next stage;
/// `None`: write now (the Ready came, the result was not taken, or the wait is over).
pub fn next_report_wait(
    reports: &[lifecycle::Report],
    status: &LifelongLearningJobStatus,
    waited: Duration,
) -> Option<Duration> {
    let last = reports.last().filter(|last| last.next_follows)?;
    let waits_for_it =
        status.phase == Some(Phase::Waiting) && status.stage == Some(last.stage?.next()) && status.round == last.round;
    NEXT_REPORT_WAIT.checked_sub(waited).filter(|rest| waits_for_it && !rest.is_zero())
}

/// Reads the job's `imagePullSecrets` again for its `oci://` policies' registries; a Secret that
/// gives nothing is said on the job (once per change), and the job goes on without it.
async fn refresh_pull_secrets(job: &LifelongLearningJob, ctx: &Context, namespace: &str, key: &str) {
    let Some(uid) = job.metadata.uid.as_deref() else { return };
    let previous = ctx.pull_secrets.auth_of(key, Some(uid));
    // Read afresh when the job itself changed (a user who fixed a Secret touches the job).
    let reads = !super::pull_secrets::registries(job).is_empty() && !super::pull_secrets::secret_names(job).is_empty();
    let afresh = reads && ctx.pull_secrets.job_changed(key, super::pull_secrets::job_metadata(job));
    let auth =
        super::pull_secrets::resolve(&ctx.client, &ctx.pull_secrets, namespace, job, previous.as_deref(), afresh).await;
    let problems = auth.problems.join("; ");
    if ctx.pull_secrets.set(key, uid, auth) {
        ctx.metrics.error("pull_secret");
        tracing::warn!(job = key, "{problems}");
        let note = format!("{problems}; its oci:// policies are pulled without them");
        ctx.events.publish(&job.object_ref(&()), true, "RegistryCredentials", "ReadPullSecrets".into(), note);
    }
}

/// How `status.message` starts while the job's spec is refused.
pub const REFUSED: &str = "refused: ";

/// Writes the spec's refusal to `status.message` (`None`: clears a former one), when that
/// changes it: a merge patch of the one field, remembered for the next status write.
async fn set_refusal(
    jobs: &Api<LifelongLearningJob>,
    job: &LifelongLearningJob,
    ctx: &Context,
    refusal: Option<String>,
    key: &str,
) -> Result<(), Error> {
    let current = ctx.written_jobs.newest(job);
    let message = current.status.as_ref().and_then(|status| status.message.as_deref());
    let unchanged = match &refusal {
        Some(refusal) => message == Some(refusal.as_str()),
        None => !message.is_some_and(|m| m.starts_with(REFUSED)),
    };
    if unchanged {
        return Ok(());
    }
    let body = json!({"status": {"message": refusal}});
    let written = jobs
        .patch_status(&job.name_any(), &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(kube_error("patch_status", key))?;
    ctx.written_jobs.wrote(written);
    Ok(())
}

/// Once a round completes, the Train and Eval pods of rounds before the newest kept ones go, in
/// one request: finished pods would otherwise pile up, two a round, in etcd and in every pod
/// watch. Housekeeping only: a failure is counted and said (once a round at most), and the next
/// round's prune takes what this one left.
async fn prune_finished_pods(ctx: &Context, namespace: &str, uid: &str, pods: &[WorkerPod], round: u64, key: &str) {
    let Some(selector) = observe::prune_selector(pods, uid, round, ctx.finished_rounds_kept) else {
        return;
    };
    let going = observe::prune_going(pods, round, ctx.finished_rounds_kept);
    if let Err(err) = delete_pods(ctx, namespace, std::slice::from_ref(&selector), &going).await {
        ctx.metrics.error("prune_pods");
        tracing::warn!(job = key, "deleting the finished pods of past rounds ({selector}): {err}");
    }
}

/// Above this many worker pods in a namespace (the default), the job's pods go by name, one
/// request each, not in one deletecollection: the API server answers a deletecollection by
/// reading every pod of the namespace (at 30,000, 7–17 s each, some 504 Gateway Timeout), a
/// delete by name reads one.
pub const DELETE_BY_NAME_PAST_PODS: usize = 1000;

/// Deletes `going`, the pods `selectors` select: one request per selector in a namespace of at
/// most [`Context::delete_by_name_past`] worker pods (the pod store's count), else one per pod
/// by name, each bound to its uid (a pod gone meanwhile, or made again under its name, is not
/// touched).
async fn delete_pods(
    ctx: &Context,
    namespace: &str,
    selectors: &[String],
    going: &[&WorkerPod],
) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let in_namespace =
        ctx.stores.pods.state().iter().filter(|pod| pod.metadata.namespace.as_deref() == Some(namespace)).count();
    if in_namespace <= ctx.delete_by_name_past {
        for selector in selectors {
            api.delete_collection(&DeleteParams::background(), &ListParams::default().labels(selector)).await?;
        }
        return Ok(());
    }
    // Each tried, the first failure returned: one refused does not keep the others.
    let mut failed = None;
    for pod in going {
        let (Some(name), uid) = (pod.metadata.name.as_deref(), pod.metadata.uid.clone()) else { continue };
        let params = DeleteParams::background().preconditions(Preconditions { uid, resource_version: None });
        match api.delete(name, &params).await {
            Ok(_) => {}
            // Gone already, or another pod under its name now: nothing of this one to delete.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(err) => failed = failed.or(Some(err)),
        }
    }
    failed.map_or(Ok(()), Err)
}

/// The job as the watch (or a write of the link's) shows it once past resourceVersion `version`,
/// waited for up to [`WATCH_CATCH_UP`]; `None` if it does not come, or the job is gone or made
/// again.
async fn newer_from_watch(ctx: &Context, job: &LifelongLearningJob, version: &str) -> Option<LifelongLearningJob> {
    let version: u64 = version.parse().ok()?;
    let reference = ObjectRef::from_obj(job);
    let deadline = tokio::time::Instant::now() + WATCH_CATCH_UP;
    loop {
        let stored = ctx.stores.jobs.get(&reference)?;
        if stored.metadata.uid != job.metadata.uid {
            return None;
        }
        let newest = ctx.written_jobs.newest(&stored);
        let seen = newest.metadata.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok());
        if seen.is_some_and(|seen| seen > version) {
            return Some(newest);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The job as the API server has it now, if it is still the same job (not deleted, not
/// re-created under the same name).
async fn read_fresh(
    jobs: &Api<LifelongLearningJob>,
    name: &str,
    uid: &str,
    key: &str,
) -> Result<Option<LifelongLearningJob>, Error> {
    let fresh = jobs.get_opt(name).await.map_err(kube_error("read_job", key))?;
    Ok(fresh.filter(|job| job.metadata.uid.as_deref() == Some(uid)))
}

/// The job's pods as the API server has them now (a worker the store lacks is confirmed gone),
/// read as the store keeps them.
async fn read_pods(ctx: &Context, namespace: &str, uid: &str, key: &str) -> Result<Vec<WorkerPod>, Error> {
    let pods: Api<WorkerPod> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{UID_LABEL}={uid}");
    let listed = pods.list(&ListParams::default().labels(&selector)).await.map_err(kube_error("read_pods", key))?;
    tracing::debug!(job = key, selector, pods = listed.items.len(), "read the job's pods");
    Ok(listed.items)
}

/// The conditions `after` has that `before` did not (the list is capped: found by the last
/// condition `before` had, by its stage, type and time, as its `data` may have been trimmed since).
pub fn added_conditions<'a>(
    before: &LifelongLearningJobStatus,
    after: &'a LifelongLearningJobStatus,
) -> &'a [JobCondition] {
    let key = |c: &JobCondition| (c.stage, c.type_, c.last_transition_time.clone());
    match before.conditions.last() {
        None => &after.conditions,
        Some(last) => match after.conditions.iter().rposition(|c| key(c) == key(last)) {
            Some(at) => &after.conditions[at + 1..],
            None => &after.conditions,
        },
    }
}

/// The Event a new condition gets, if any: (reason, note). The status keeps every condition; an
/// Event is for a reader of the job's story (`kubectl describe`) and costs the API server a
/// write (one per transition was a third of a round's requests). So a round and stage gets one
/// Event, when its worker is created ([`started_note`]: the trigger's reason, the model chosen),
/// and a condition only where no worker is: a new job's first Waiting, and a Deploy that
/// completes without one (the selector chose no model). A failure is said by the stage
/// machine's `StageFailed` warning, which says when the retry comes.
pub fn condition_event(
    condition: &JobCondition,
    previous: Option<&JobCondition>,
    status: &LifelongLearningJobStatus,
) -> Option<(&'static str, String)> {
    match (condition.stage, condition.type_, previous.map(|p| (p.stage, p.type_))) {
        (Stage::Train, Phase::Waiting, None) => Some(("TrainWaiting", "waiting for the trigger".to_owned())),
        (Stage::Deploy, Phase::Completed, Some((Stage::Deploy, Phase::Waiting))) => {
            let why = status.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
            Some(("DeployCompleted", format!("round {}: no model deployed{why}", status.round)))
        }
        _ => None,
    }
}

/// The note of a round and stage's Event, once its worker `pod` is created: what started it (the
/// trigger's reason), what it works on (the models to evaluate, the model chosen to deploy).
pub fn started_note(stage: Stage, status: &LifelongLearningJobStatus, pod: &str) -> String {
    let models = status.data.as_ref().and_then(|d| d.input.as_ref()).map(|i| &i.models[..]).unwrap_or_default();
    let urls = models.iter().map(|m| m.url.as_str()).collect::<Vec<_>>().join(", ");
    let why = status.message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default();
    let what = match stage {
        Stage::Train => format!("triggered{why}"),
        Stage::Eval => format!("evaluating {urls}"),
        Stage::Deploy => format!("deploying {urls}{why}"),
    };
    format!("round {}: {what}; created the {} pod {pod}", status.round, stage.worker_kind())
}

/// Carries out one action of the step that left the job in `status`; `first`: the stage's first
/// worker of the round (said as the stage's start, not as a re-creation); `pods`: the job's pods
/// as the step saw them.
async fn act(
    job: &LifelongLearningJob,
    ctx: &Context,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    action: &Action,
    status: &LifelongLearningJobStatus,
    first: bool,
    pods: &[WorkerPod],
) -> Result<(), Error> {
    let (namespace, key, round) = (namespace_of(job), perennial_api::key(&job.metadata), status.round);
    match action {
        Action::StartWorker(spec) => match start_worker(job, ctx, spec, status).await {
            // Made by an operator process before this one (its create in flight when it died):
            // the one worker there is, not said again.
            Ok(Started::Existed(pod)) => {
                tracing::info!(
                    job = key,
                    round = spec.round,
                    pod,
                    "the {} pod exists already",
                    spec.stage.worker_kind()
                );
            }
            Ok(Started::Created(pod)) => {
                ctx.metrics.pod_created(spec.stage.worker_kind());
                let action = format!("Round{}{}", spec.round, spec.stage);
                let (reason, note) = if first {
                    (started_reason(spec.stage), started_note(spec.stage, status, &pod))
                } else {
                    let note =
                        format!("round {}: created the {} pod {pod} again", spec.round, spec.stage.worker_kind());
                    ("WorkerCreated", note)
                };
                ctx.events.publish(reference, false, reason, action, note);
            }
            // Said on the job; the next reconcile finds no pod and tries again (counted).
            Err(err) => {
                ctx.metrics.error(err.kind());
                let action = format!("Round{}{}", spec.round, spec.stage);
                ctx.events.publish(reference, true, "WorkerNotCreated", action, err.to_string());
                return Err(err);
            }
        },
        // Deploy replaces the inference pod of any round, and the finished pods of past rounds
        // go with it (`deploy_deletions`: one request, none when nothing is there; by name in a
        // crowded namespace, `delete_pods`).
        Action::StopWorkers { stage: Stage::Deploy } => {
            let uid = job.metadata.uid.clone().unwrap_or_default();
            let selectors = observe::deploy_deletions(pods, &uid, round, ctx.finished_rounds_kept);
            let going = observe::deploy_going(pods, round, ctx.finished_rounds_kept);
            delete_pods(ctx, &namespace, &selectors, &going).await.map_err(kube_error("delete_pods", &key))?;
        }
        // No request when no such pod is there to stop (a vanished worker): the pod store,
        // complete before any reconcile, and the pods created here that it does not show yet
        // say so.
        Action::StopWorkers { stage } if !observe::any_to_stop(pods, *stage, round) => {}
        Action::StopWorkers { stage } => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
            let uid = job.metadata.uid.clone().unwrap_or_default();
            // A failed Train or Eval stops its own round's worker: the finished ones of the rounds
            // kept stay for `kubectl logs`.
            let selector =
                format!("{UID_LABEL}={uid},{WORKER_TYPE_LABEL}={},{ROUND_LABEL}={round}", stage.worker_kind());
            pods.delete_collection(&DeleteParams::background(), &ListParams::default().labels(&selector))
                .await
                .map_err(kube_error("delete_pods", &key))?;
        }
        // The status just written is the notice: the link sends each node its jobs' status.
        Action::Edge(notice) => {
            tracing::debug!(job = key, round = notice.round, "the edge waits for {}", notice.stage)
        }
        Action::Event { warning, reason, message } => {
            if *warning {
                // With the pods the step judged by: a worker taken for vanished names what it saw.
                let seen: Vec<(&str, Option<&String>)> = pods
                    .iter()
                    .map(|pod| (pod.metadata.name.as_deref().unwrap_or_default(), pod.labels().get(ROUND_LABEL)))
                    .collect();
                tracing::debug!(job = key, reason, pods = ?seen, "{message}");
            }
            ctx.events.publish(reference, *warning, reason, format!("Round{round}"), message.clone());
        }
    }
    Ok(())
}

fn started_reason(stage: Stage) -> &'static str {
    match stage {
        Stage::Train => "TrainStarted",
        Stage::Eval => "EvalStarted",
        Stage::Deploy => "DeployStarted",
    }
}

/// What [`start_worker`] did: the pod's name, and whether this call made it.
enum Started {
    Created(String),
    Existed(String),
}

/// Creates the stage's pod from the job's template, named by which start of the stage it is
/// (`pod_name`), so that a second create of the same start finds the first's pod (a vanished
/// worker's too, until it is gone).
async fn start_worker(
    job: &LifelongLearningJob,
    ctx: &Context,
    spec: &WorkerSpec,
    status: &LifelongLearningJobStatus,
) -> Result<Started, Error> {
    let (namespace, key) = (namespace_of(job), perennial_api::key(&job.metadata));
    let dataset_name = &job.spec.dataset.name;
    // From the Dataset watch only: the edge heard of the job through that watch (its Dataset's
    // node), so a Dataset it lacks is one deleted since (and the operator needs no `get` on them).
    let Some(dataset) = ctx.stores.datasets.get(&ObjectRef::new(dataset_name).within(&namespace)) else {
        return Err(Error::DatasetMissing { job: key, dataset: dataset_name.clone() });
    };
    let dataset = dataset.as_ref().clone();
    let job_credential = credential(ctx, &namespace, job.spec.credential_name.as_deref(), &key).await?;
    let dataset_credential = credential(ctx, &namespace, dataset.spec.credential_name.as_deref(), &key).await?;
    let kind = spec.stage.worker_kind();
    let worker_name = perennial_types::new_worker_name(kind).map_err(|err| Error::Kube {
        what: "worker_name",
        object: key.clone(),
        source: Box::new(kube::Error::Service(Box::new(err))),
    })?;
    let context = PodContext {
        job,
        dataset: &dataset,
        worker_name: &worker_name,
        lc_server: &ctx.workers.lc_server,
        kb_server: &ctx.workers.kb_server,
        fetch_image: &ctx.workers.fetch_image,
        job_credential,
        dataset_credential,
    };
    let mut pod = build_pod(spec, &context);
    pod.metadata.annotations.get_or_insert_with(Default::default).insert(WORKER_NAME_ANNOTATION.into(), worker_name);
    let start = Start {
        job_uid: job.metadata.uid.as_deref().unwrap_or_default(),
        kind,
        round: spec.round,
        retries: status.retries,
    };
    let name = worker_pod_name(&job.name_any(), &start);
    pod.metadata.name = Some(name.clone());
    pod.metadata.generate_name = None;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let created = match pods.create(&PostParams::default(), &pod).await {
        Ok(created) => created,
        // Only AlreadyExists: a 409 Conflict (a ResourceQuota updated meanwhile) made nothing.
        Err(kube::Error::Api(status)) if status.code == 409 && status.is_already_exists() => {
            return Ok(Started::Existed(name));
        }
        Err(err) => return Err(kube_error("create_pod", &key)(err)),
    };
    let name = created.name_any();
    ctx.written.created(start.job_uid, created.into());
    tracing::info!(job = key, round = spec.round, pod = name, "created the {kind} pod");
    Ok(Started::Created(name))
}

/// A credential Secret as the pod builder needs it: its name and the endpoint of its
/// annotations (never its keys: those reach pods by `secretKeyRef`).
async fn credential(
    ctx: &Context,
    namespace: &str,
    name: Option<&str>,
    key: &str,
) -> Result<Option<Credential>, Error> {
    let Some(name) = name.filter(|n| !n.is_empty()) else { return Ok(None) };
    // Only a Secret of the job's own namespace, by a plain name (a Dataset's is not validated
    // before this): never another namespace's, never a path.
    if let Some(why) = perennial_api::credential_refusal(Some(name), namespace) {
        return Err(Error::Credential(format!("{key}: spec.credentialName: {why}")));
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let secret = secrets.get_metadata(name).await.map_err(|err| match err {
        // The cluster-wide install grants Secrets per namespace: say which grant is missing.
        kube::Error::Api(status) if status.code == 403 => Error::Credential(format!(
            "{key}: the operator may not read the Secret {namespace}/{name} (credentialName): bind the ClusterRole \
             perennial-operator-credentials in {namespace} (docs: \"Run on a cluster\"): {}",
            status.message
        )),
        err => kube_error("read_secret", key)(err),
    })?;
    let annotations = secret.metadata.annotations.unwrap_or_default();
    Ok(endpoint_url(&annotations).map(|endpoint_url| Credential { secret: name.to_owned(), endpoint_url }))
}

/// The job is being deleted: its pods go (owner references would take them too, but only once
/// the job is gone), its waiting reports are dropped, and the edge forgets it (the job leaves
/// the node's desired state).
async fn cleanup(job: &LifelongLearningJob, ctx: &Context) -> Result<Requeue, Error> {
    let (namespace, name, key) = (namespace_of(job), job.name_any(), perennial_api::key(&job.metadata));
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    ctx.running_holds.forget(&key);
    let uid = job.metadata.uid.clone().unwrap_or_default();
    // The job's pods as the watch shows them, with any created here that it does not show yet.
    let remaining = job_pods(ctx, &uid);
    if remaining.is_empty() || remaining.iter().any(|pod| pod.metadata.deletion_timestamp.is_none()) {
        // Also when none is seen: a pod the watch has not shown yet may be there.
        pods.delete_collection(
            &DeleteParams::background(),
            &ListParams::default().labels(&format!("{UID_LABEL}={uid}")),
        )
        .await
        .map_err(kube_error("delete_pods", &key))?;
    }
    if !remaining.is_empty() {
        // The finalizer stays until the kubelet has stopped them: a job re-created at once must
        // not meet the old one's workers still running.
        return Err(Error::PodsTerminating { job: key, pods: remaining.len() });
    }
    ctx.inbox.forget(&namespace, &name);
    ctx.pull_secrets.forget(&key);
    ctx.written.forget(&uid);
    ctx.written_jobs.forget(&uid);
    let note = "the job's pods are deleted and its edge forgets it".to_owned();
    ctx.events.publish(&job.object_ref(&()), false, "Deleted", "Delete".into(), note);
    tracing::info!(job = key, "deleted: its pods are removed");
    Ok(Requeue::await_change())
}

/// The dataset's sample count as its edge reported it, written to its status (a merge patch of
/// the two fields: nothing else in the status is touched).
pub async fn write_dataset_status(client: Client, namespace: &str, name: &str, samples: u64) -> Result<(), Error> {
    let datasets: Api<Dataset> = Api::namespaced(client, namespace);
    let body = json!({"status": {"numberOfSamples": samples, "updateTime": Timestamp::now().to_string()}});
    datasets
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(kube_error("patch_dataset_status", &format!("{namespace}/{name}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(stage: Stage, type_: Phase) -> JobCondition {
        JobCondition {
            stage,
            type_,
            status: "True".into(),
            last_heartbeat_time: None,
            last_transition_time: None,
            reason: None,
            message: None,
            data: None,
        }
    }

    #[test]
    fn the_added_conditions_are_found_though_older_data_was_trimmed() {
        use Phase::*;
        use Stage::*;
        let at = |secs: i64| Some(perennial_api::Time(jiff::Timestamp::from_second(1_800_000_000 + secs).unwrap()));
        let with = |stage, phase, secs, data: Option<&str>| JobCondition {
            last_transition_time: at(secs),
            data: data.map(str::to_owned),
            ..condition(stage, phase)
        };
        let before = LifelongLearningJobStatus {
            conditions: vec![with(Train, Waiting, 0, None), with(Train, Ready, 1, Some("{\"input\":{}}"))],
            ..Default::default()
        };
        // The step trimmed the data of the condition `before` ended with.
        let after = LifelongLearningJobStatus {
            conditions: vec![
                with(Train, Waiting, 0, None),
                with(Train, Ready, 1, None),
                with(Train, Failed, 2, None),
                with(Train, Waiting, 3, None),
            ],
            ..Default::default()
        };
        let added: Vec<_> = added_conditions(&before, &after).iter().map(|c| (c.stage, c.type_)).collect();
        assert_eq!(added, [(Train, Failed), (Train, Waiting)]);
    }

    #[test]
    fn only_a_new_job_and_a_deploy_without_a_worker_get_a_condition_event() {
        use Phase::*;
        use Stage::*;
        let status =
            LifelongLearningJobStatus { round: 3, message: Some("no candidate beats it".into()), ..Default::default() };
        let said = |stage, phase, previous: Option<(Stage, Phase)>| {
            let previous = previous.map(|(stage, phase)| condition(stage, phase));
            condition_event(&condition(stage, phase), previous.as_ref(), &status).map(|(reason, _)| reason)
        };
        assert_eq!(said(Train, Waiting, None), Some("TrainWaiting"), "a new job");
        assert_eq!(
            condition_event(&condition(Deploy, Completed), Some(&condition(Deploy, Waiting)), &status),
            Some(("DeployCompleted", "round 3: no model deployed: no candidate beats it".to_owned()))
        );
        for (stage, phase, previous) in [
            (Train, Ready, (Train, Waiting)),
            (Train, Starting, (Train, Ready)),
            (Train, Running, (Train, Starting)),
            (Train, Completed, (Train, Running)),
            (Eval, Waiting, (Train, Completed)),
            (Deploy, Completed, (Deploy, Starting)),
            (Train, Waiting, (Deploy, Completed)),
            (Deploy, Failed, (Deploy, Starting)),
            (Train, Waiting, (Deploy, Failed)),
        ] {
            assert_eq!(said(stage, phase, Some(previous)), None, "{stage} {phase} after {previous:?}");
        }
    }

    #[test]
    fn a_train_result_waits_for_the_eval_ready_its_edge_follows_it_with_and_no_longer() {
        let result = |follows| lifecycle::Report {
            round: 2,
            stage: Some(Stage::Train),
            status: Some(Phase::Completed),
            next_follows: follows,
            ..Default::default()
        };
        let waiting = |stage, round| LifelongLearningJobStatus {
            stage: Some(stage),
            phase: Some(Phase::Waiting),
            round,
            ..Default::default()
        };
        let ms = Duration::from_millis;
        assert_eq!(next_report_wait(&[result(true)], &waiting(Stage::Eval, 2), ms(500)), Some(ms(1500)));
        assert_eq!(next_report_wait(&[result(true)], &waiting(Stage::Eval, 2), ms(2000)), None, "waited enough");
        assert_eq!(next_report_wait(&[result(false)], &waiting(Stage::Eval, 2), ms(0)), None, "an older agent");
        let taken =
            [result(true), lifecycle::Report { stage: Some(Stage::Eval), status: Some(Phase::Ready), ..result(false) }];
        assert_eq!(next_report_wait(&taken, &waiting(Stage::Eval, 2), ms(0)), None, "the Ready came with it");
        assert_eq!(next_report_wait(&[result(true)], &waiting(Stage::Train, 2), ms(0)), None, "the result not taken");
        let failed = LifelongLearningJobStatus { phase: Some(Phase::Failed), ..waiting(Stage::Train, 2) };
        assert_eq!(next_report_wait(&[result(true)], &failed, ms(0)), None, "the stage failed");
        assert_eq!(next_report_wait(&[], &waiting(Stage::Eval, 2), ms(0)), None, "no report");
    }

    #[test]
    fn a_stage_start_says_the_triggers_reason_and_the_model_chosen() {
        let model = |url: &str| perennial_api::Model { format: "pkl".into(), url: url.into(), metrics: None };
        let input = |urls: &[&str]| perennial_api::ConditionData {
            input: Some(perennial_api::Input { models: urls.iter().map(|u| model(u)).collect(), ..Default::default() }),
            output: None,
        };
        let mut status = LifelongLearningJobStatus {
            round: 4,
            message: Some("num_of_samples 50 >= 40".into()),
            data: Some(input(&[])),
            ..Default::default()
        };
        assert_eq!(
            started_note(Stage::Train, &status, "j-train-x"),
            "round 4: triggered (num_of_samples 50 >= 40); created the train pod j-train-x"
        );
        status.message = None;
        status.data = Some(input(&["/o/train/4/model.pkl"]));
        assert_eq!(
            started_note(Stage::Eval, &status, "j-eval-x"),
            "round 4: evaluating /o/train/4/model.pkl; created the eval pod j-eval-x"
        );
        status.message = Some("mlogloss 0.21 beats 0.34".into());
        assert_eq!(
            started_note(Stage::Deploy, &status, "j-inference-x"),
            "round 4: deploying /o/train/4/model.pkl (mlogloss 0.21 beats 0.34); created the inference pod j-inference-x"
        );
    }
}
