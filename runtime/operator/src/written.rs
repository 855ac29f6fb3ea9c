//! Read-your-writes over the watches. Jobs: the API server's answer to each status write is
//! kept until the job store shows that version, so that the next reconcile starts from what was
//! written, not from a store a write behind (whose status patch would be refused as a conflict).
//! The job watch says when it stored a version ([`WrittenJobs::shown`], [`WrittenJobs::relisted`]),
//! so an answer goes as soon as the store shows it, not at the job's next reconcile (an answer
//! that came after its own watch event stayed until the job changed again).
//!
//! Pods: A job's pods are read from the operator's own pod store
//! (filled by its one pod watch: no API call), which may not show yet a pod this operator
//! created a moment ago. Each pod it creates is remembered until the store shows it, and added
//! to the reads that do not, so that the stage machine never takes a pod still in flight for a
//! vanished one and creates it twice.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use kube::runtime::reflector::{ObjectRef, Store};
use perennial_api::LifelongLearningJob;

use super::worker_pod::WorkerPod;

/// How long a created pod is remembered at most: far past any cache lag.
const REMEMBER: Duration = Duration::from_secs(60);

/// The pods this operator created, by job uid, until a list shows them.
#[derive(Default)]
pub struct WrittenPods {
    created: Mutex<HashMap<String, Vec<(WorkerPod, Instant)>>>,
}

impl WrittenPods {
    /// Remembers `pod` (the API server's answer to its creation) for job `uid`, trimmed as the
    /// pod store keeps its pods.
    pub fn created(&self, uid: &str, mut pod: WorkerPod) {
        super::watches::trim_pod(&mut pod);
        let mut created = self.created.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        created.entry(uid.to_owned()).or_default().push((pod, Instant::now()));
    }

    /// `listed` (from the store, complete up to resourceVersion `version`) with the pods created
    /// for `uid` that it does not show yet.
    pub fn with_created(&self, uid: &str, listed: Vec<WorkerPod>, version: Option<u64>) -> Vec<WorkerPod> {
        let mut created = self.created.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(remembered) = created.get_mut(uid) else { return listed };
        let (pods, still) = merge(listed, version, std::mem::take(remembered), Instant::now());
        if still.is_empty() {
            created.remove(uid);
        } else {
            *remembered = still;
        }
        pods
    }

    /// Forgets a job (deleted).
    pub fn forget(&self, uid: &str) {
        self.created.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(uid);
    }
}

/// The jobs as this operator last wrote them, by uid, until the store shows them.
#[derive(Default)]
pub struct WrittenJobs {
    /// Boxed: a table of whole jobs kept its capacity (2,000 jobs' worth after a start) though
    /// it empties as the store catches up.
    written: Mutex<HashMap<String, Box<LifelongLearningJob>>>,
    /// The job watch's store, once it runs: an answer it already shows is not kept.
    store: OnceLock<Store<LifelongLearningJob>>,
    /// How many are kept (the operator's `written_jobs_kept`).
    kept: prometheus_client::metrics::gauge::Gauge,
}

impl WrittenJobs {
    /// Counted in `gauge`.
    pub fn counted_in(gauge: prometheus_client::metrics::gauge::Gauge) -> WrittenJobs {
        WrittenJobs { kept: gauge, ..WrittenJobs::default() }
    }

    /// Locks the table; its size is counted when the guard goes.
    fn table(&self) -> Counted<'_> {
        Counted { table: self.written.lock().unwrap_or_else(|poisoned| poisoned.into_inner()), gauge: &self.kept }
    }

    /// Follows `store`, whose watch calls [`WrittenJobs::shown`] for each job it stores.
    pub fn follow(&self, store: Store<LifelongLearningJob>) {
        let _ = self.store.set(store);
    }

    /// Remembers `job` (the API server's answer to a status write), unless a newer answer is
    /// remembered already (the reconciler and the link write the same job, each its fields), the
    /// store shows it already (its watch event may come before the answer), or the store no
    /// longer holds that job (deleted, or made again under its name: nothing would forget it).
    pub fn wrote(&self, mut job: LifelongLearningJob) {
        let Some(uid) = job.metadata.uid.clone() else { return };
        super::watches::trim_meta(&mut job);
        // Under the lock: the watch stores a version before it calls `shown` for it, so either
        // the store shows it here, or `shown` comes after this and forgets it.
        let mut written = self.table();
        if let Some(store) = self.store.get() {
            let stored = store.get(&ObjectRef::from_obj(&job)).filter(|stored| stored.metadata.uid == job.metadata.uid);
            let Some(stored) = stored else {
                written.remove(&uid);
                return;
            };
            if version(&stored) >= version(&job) {
                // Shown: only a newer answer the store does not show yet stays.
                if written.get(&uid).is_some_and(|known| version(known) <= version(&stored)) {
                    written.remove(&uid);
                }
                return;
            }
        }
        match written.get(&uid) {
            Some(known) if version(known) >= version(&job) => {}
            _ => {
                super::stored_templates::compact(&mut job);
                written.insert(uid, Box::new(job));
            }
        }
    }

    /// The job watch listed the jobs again (its store replaced whole, with no event for the jobs
    /// deleted meanwhile): what the store now shows, or no longer holds, is forgotten.
    pub fn relisted(&self) {
        let Some(store) = self.store.get() else { return };
        let mut written = self.table();
        written.retain(|_, known| {
            let stored = store.get(&ObjectRef::from_obj(known.as_ref()));
            stored.is_some_and(|stored| stored.metadata.uid == known.metadata.uid && version(&stored) < version(known))
        });
    }

    /// The job watch stored `job`: an answer at or before its version is no longer needed.
    pub fn shown(&self, job: &LifelongLearningJob) {
        let Some(uid) = job.metadata.uid.as_deref() else { return };
        let mut written = self.table();
        if written.get(uid).is_some_and(|known| version(known) <= version(job)) {
            written.remove(uid);
        }
    }

    /// The newer of `stored` (from the job store) and the job as last written; a written one the
    /// store has caught up with is forgotten.
    pub fn newest(&self, stored: &LifelongLearningJob) -> LifelongLearningJob {
        let Some(uid) = stored.metadata.uid.as_deref() else { return stored.clone() };
        let mut written = self.table();
        match written.get(uid) {
            Some(job) if version(job) > version(stored) => job.as_ref().clone(),
            Some(_) => {
                written.remove(uid);
                stored.clone()
            }
            None => stored.clone(),
        }
    }

    /// Forgets a job (deleted).
    pub fn forget(&self, uid: &str) {
        self.table().remove(uid);
    }

    /// How many answers are kept (for tests: none once the store caught up).
    pub fn kept(&self) -> usize {
        self.table().len()
    }
}

/// The locked table of [`WrittenJobs`], whose size goes to its gauge when unlocked.
struct Counted<'a> {
    table: std::sync::MutexGuard<'a, HashMap<String, Box<LifelongLearningJob>>>,
    gauge: &'a prometheus_client::metrics::gauge::Gauge,
}

impl std::ops::Deref for Counted<'_> {
    type Target = HashMap<String, Box<LifelongLearningJob>>;
    fn deref(&self) -> &Self::Target {
        &self.table
    }
}

impl std::ops::DerefMut for Counted<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.table
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.gauge.set(i64::try_from(self.table.len()).unwrap_or(i64::MAX));
    }
}

/// A job's resourceVersion as a number (the API server's are etcd revisions).
fn version(job: &LifelongLearningJob) -> Option<u64> {
    job.metadata.resource_version.as_deref()?.parse().ok()
}

/// The listed pods plus the remembered ones they lack; and what stays remembered: not listed
/// yet, not older than [`REMEMBER`], and created after the store's version (a store at or past
/// a pod's creation that lacks it says it is gone: deleted since).
fn merge(
    mut listed: Vec<WorkerPod>,
    list_version: Option<u64>,
    remembered: Vec<(WorkerPod, Instant)>,
    now: Instant,
) -> (Vec<WorkerPod>, Vec<(WorkerPod, Instant)>) {
    let number = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok());
    let mut still = Vec::new();
    for (pod, at) in remembered {
        let shown = listed.iter().any(|p| p.metadata.uid.is_some() && p.metadata.uid == pod.metadata.uid);
        let passed = matches!(
            (list_version, number(pod.metadata.resource_version.as_deref())),
            (Some(list), Some(created)) if list >= created
        );
        if shown || passed || now.duration_since(at) > REMEMBER {
            continue;
        }
        listed.push(pod.clone());
        still.push((pod, at));
    }
    (listed, still)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> WorkerPod {
        let metadata = serde_json::json!({"name": format!("p-{uid}"), "uid": uid, "resourceVersion": "100"});
        serde_json::from_value(serde_json::json!({ "metadata": metadata })).unwrap()
    }

    fn uids(pods: &[WorkerPod]) -> Vec<String> {
        pods.iter().map(|p| p.metadata.uid.clone().unwrap_or_default()).collect()
    }

    #[test]
    fn a_created_pod_is_seen_until_the_cache_shows_it_then_forgotten() {
        let written = WrittenPods::default();
        written.created("job", pod("b"));
        // The cache lags (its list predates the creation): the new pod is added.
        assert_eq!(uids(&written.with_created("job", vec![pod("a")], Some(99))), ["a", "b"]);
        // The cache caught up: listed once, and forgotten.
        assert_eq!(uids(&written.with_created("job", vec![pod("a"), pod("b")], Some(101))), ["a", "b"]);
        assert_eq!(uids(&written.with_created("job", vec![pod("a")], Some(102))), ["a"], "not brought back");
        assert_eq!(uids(&written.with_created("other", vec![], None)), Vec::<String>::new());
    }

    #[test]
    fn a_list_past_the_creation_that_lacks_the_pod_says_it_is_gone() {
        let written = WrittenPods::default();
        written.created("job", pod("b"));
        assert_eq!(uids(&written.with_created("job", vec![], Some(100))), Vec::<String>::new());
        assert_eq!(uids(&written.with_created("job", vec![], Some(99))), Vec::<String>::new(), "forgotten");
    }

    fn job(version: &str) -> LifelongLearningJob {
        let value = serde_json::json!({
            "apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob",
            "metadata": {"name": "j", "namespace": "ml", "uid": "u", "resourceVersion": version},
            "spec": {"dataset": {"name": "d", "trainProb": 0.8},
                     "trainSpec": {"template": {}, "trigger": {}}, "evalSpec": {"template": {}},
                     "deploySpec": {"template": {}}, "outputDir": "/o"}
        });
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_written_job_is_used_until_the_store_shows_it() {
        let written = WrittenJobs::default();
        let version = |job: LifelongLearningJob| job.metadata.resource_version.unwrap();
        assert_eq!(version(written.newest(&job("5"))), "5", "nothing written");
        written.wrote(job("7"));
        assert_eq!(version(written.newest(&job("6"))), "7", "the store is a write behind");
        assert_eq!(version(written.newest(&job("7"))), "7");
        assert_eq!(version(written.newest(&job("6"))), "6", "forgotten once the store caught up");
        written.wrote(job("9"));
        written.wrote(job("8"));
        assert_eq!(version(written.newest(&job("7"))), "9", "an older answer that came later is not kept");
        written.forget("u");
        assert_eq!(version(written.newest(&job("8"))), "8");
    }

    /// The watch storing the version forgets an answer, whether it came before or after it.
    /// A `WrittenJobs` following a job store that the test fills as the job watch would.
    fn watched() -> (WrittenJobs, kube::runtime::reflector::store::Writer<LifelongLearningJob>) {
        let (store, writer) = kube::runtime::reflector::store();
        let written = WrittenJobs::default();
        written.follow(store);
        (written, writer)
    }

    fn store(writer: &mut kube::runtime::reflector::store::Writer<LifelongLearningJob>, job: LifelongLearningJob) {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(job));
    }

    #[test]
    fn a_written_job_is_forgotten_once_the_watch_stores_it_whichever_comes_first() {
        let (written, mut writer) = watched();
        store(&mut writer, job("5"));
        written.wrote(job("7"));
        assert_eq!(written.kept(), 1, "the store is a write behind");
        written.shown(&job("6"));
        assert_eq!(written.kept(), 1, "an older version shown keeps it");
        store(&mut writer, job("7"));
        written.shown(&job("7"));
        assert_eq!(written.kept(), 0, "the watch stored it");
        // The watch event came before the write's answer.
        store(&mut writer, job("9"));
        written.shown(&job("9"));
        written.wrote(job("9"));
        assert_eq!(written.kept(), 0, "already stored: not kept");
        written.wrote(job("10"));
        assert_eq!(written.kept(), 1);
    }

    /// Two writers (the reconciler, the link): an older answer that comes late, when the store
    /// shows it, must not forget the newer one the store does not show yet.
    #[test]
    fn a_late_older_answer_keeps_the_newer_one_the_store_lacks() {
        let (written, mut writer) = watched();
        store(&mut writer, job("9"));
        written.wrote(job("12"));
        store(&mut writer, job("10"));
        written.shown(&job("10"));
        written.wrote(job("10"));
        assert_eq!(written.kept(), 1);
        assert_eq!(written.newest(&job("10")).metadata.resource_version.as_deref(), Some("12"));
    }

    #[test]
    fn an_answer_for_a_job_the_store_no_longer_holds_is_not_kept() {
        let (written, mut writer) = watched();
        written.wrote(job("7"));
        assert_eq!(written.kept(), 0, "deleted (its Delete event came first)");
        let mut again = job("8");
        again.metadata.uid = Some("another".into());
        store(&mut writer, again);
        written.wrote(job("9"));
        assert_eq!(written.kept(), 0, "made again under its name: another uid");
    }

    #[test]
    fn a_relist_forgets_what_the_store_shows_or_lost() {
        let (written, mut writer) = watched();
        store(&mut writer, job("6"));
        written.wrote(job("7"));
        assert_eq!(written.kept(), 1);
        written.relisted();
        assert_eq!(written.kept(), 1, "the store is still behind");
        store(&mut writer, job("7"));
        written.relisted();
        assert_eq!(written.kept(), 0, "shown by the relist");
    }

    #[test]
    fn a_written_job_is_kept_without_its_managed_fields() {
        let written = WrittenJobs::default();
        let mut answer = job("7");
        answer.metadata.managed_fields = Some(vec![Default::default()]);
        written.wrote(answer);
        assert_eq!(written.newest(&job("6")).metadata.managed_fields, None);
    }

    #[test]
    fn a_remembered_pod_expires() {
        let now = Instant::now();
        let old = now.checked_sub(REMEMBER + Duration::from_secs(1)).unwrap_or(now);
        let (pods, still) = merge(vec![], None, vec![(pod("x"), old), (pod("y"), now)], now);
        assert_eq!(uids(&pods), ["y"]);
        assert_eq!(still.len(), 1);
    }
}
