//! The operator's side of the cloud–edge link: the listener (leader only), agents' projected
//! ServiceAccount tokens checked by TokenReview ([`super::identity`]), static node tokens from a
//! Secret (nodes outside the cluster), each node's desired state from the cluster (reflectors over jobs, datasets and their
//! pods, folded by the pure [`node_state`](super::node_state)), and edge reports applied through
//! the same inbox and stage machine as every reconcile. A report is acknowledged to the edge only
//! once the job status that applied it is written.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::UnboundedReceiver;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client};
use serde::Deserialize as _;
use serde_json::Value;
use tokio::sync::watch;
use tokio_rustls::rustls::ServerConfig;

use super::artifacts::{Artifacts, RETRY_REFUSED};
use super::early_reports::EarlyReports;
use super::identity::{IdentitySettings, TokenReviewer};
use super::inbox::Inbox;
use super::node_state::DesiredNodes;
use super::observe::UID_LABEL;
use super::pull_secrets::PullSecrets;
use super::reconcile::write_dataset_status;
use super::watches::{Seen, Stores};
use super::written::WrittenJobs;
use perennial_api::{LifelongLearningJob, LifelongLearningJobStatus};
use perennial_link::cloud_server::{Applied, ArtifactPiece, CloudSide, NodeDesired, ServerSettings, serve};
use perennial_link::desired::DesiredObject;
use perennial_link::messages::PolicyPlatform;
use perennial_link::socket::{NodeTokens, server_tls};
use perennial_types::{JobConfig, PolicyArtifact, Report};

/// How long a report may wait for the status write that applies it before it is said (debug).
/// The connection keeps waiting: ended, its edge would reconnect, resync and resend the report
/// into the same queue (a burst of 1,000 jobs' rounds at once ended thousands of connections).
/// The job's own errors are said by its reconcile; a deleted job ends the wait.
const APPLY_SLOW: Duration = Duration::from_secs(60);
/// How long it waits in all: then the connection ends and the edge resends (a report the
/// operator will never take, its job refused or gone meanwhile, must not hold the node's later
/// reports for ever; the edge learns of a job's end from the resync).
const APPLY_GIVE_UP: Duration = Duration::from_secs(600);

/// How often the node tokens' Secret is read again (the operator may only `get` Secrets).
const TOKENS_REFRESH: Duration = Duration::from_secs(30);

/// The link's settings (`perennial operator --link-*`).
#[derive(Clone, Debug)]
pub struct LinkOptions {
    pub addr: SocketAddr,
    /// The listener's certificate chain and key (PEM), e.g. a mounted `kubernetes.io/tls` Secret.
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The Secret holding one key per node name, its bearer token the value.
    pub tokens_secret: String,
    pub tokens_namespace: String,
    /// Agents in the cluster: their projected ServiceAccount tokens, checked by TokenReview.
    pub identity: IdentitySettings,
    pub heartbeat_secs: u32,
    /// Policies compiled for the nodes that say their platform (`--sign-key`).
    pub artifacts: Option<Arc<Artifacts>>,
}

#[derive(Debug, thiserror::Error)]
pub enum LinkSetupError {
    #[error("{what} {path}: {message}")]
    File { what: &'static str, path: String, message: String },
    #[error("link listener {address}: {source}")]
    Listen { address: SocketAddr, source: std::io::Error },
}

/// Each node's desired state, as a channel its connection follows. A node that said its platform
/// gets, in each job's config, the offers of the policies compiled for it ([`Artifacts`]).
#[derive(Default)]
pub struct NodeBook {
    book: Mutex<Book>,
    /// `None`: the operator compiles nothing (no `--sign-key`).
    artifacts: Option<Arc<Artifacts>>,
    /// The jobs' registry logins, added to each job's config (`registryAuth`).
    pull_secrets: Option<Arc<PullSecrets>>,
}

#[derive(Default)]
struct Book {
    /// What each node's connection follows: its desired state with the offers.
    nodes: HashMap<String, watch::Sender<Arc<NodeDesired>>>,
    /// Each node's desired state as the cluster makes it, before the offers.
    plain: HashMap<String, NodeDesired>,
    /// What each connected node said it runs.
    platforms: HashMap<String, PolicyPlatform>,
}

impl NodeBook {
    /// A book whose nodes get the policies `artifacts` compiles for them.
    pub fn compiling(artifacts: Arc<Artifacts>) -> NodeBook {
        NodeBook { artifacts: Some(artifacts), ..NodeBook::default() }
    }

    /// This book with each job's registry logins from `pull_secrets` in its config.
    pub fn with_pull_secrets(self, pull_secrets: Arc<PullSecrets>) -> NodeBook {
        NodeBook { pull_secrets: Some(pull_secrets), ..self }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every node's state now; a node left out holds nothing.
    pub fn replace_all(&self, mut desired: BTreeMap<String, NodeDesired>) {
        let mut book = self.lock();
        let known: Vec<String> = book.nodes.keys().cloned().collect();
        for node in known {
            let next = desired.remove(&node).unwrap_or_default();
            self.publish(&mut book, &node, next);
        }
        for (node, next) in desired {
            self.publish(&mut book, &node, next);
        }
    }

    /// One node's state now.
    pub fn set(&self, node: &str, next: NodeDesired) {
        self.publish(&mut self.lock(), node, next);
    }

    /// What `node` said it runs when it connected (`None`: an agent that did not say).
    pub fn set_platform(&self, node: &str, platform: Option<&PolicyPlatform>) {
        let mut book = self.lock();
        let changed = match platform {
            Some(platform) => book.platforms.insert(node.to_owned(), platform.clone()).as_ref() != Some(platform),
            None => book.platforms.remove(node).is_some(),
        };
        if changed {
            let plain = book.plain.get(node).cloned().unwrap_or_default();
            self.publish(&mut book, node, plain);
        }
    }

    /// Every node's offers made again (a compile finished).
    pub fn refresh(&self) {
        let mut book = self.lock();
        let nodes: Vec<String> = book.platforms.keys().cloned().collect();
        for node in nodes {
            let plain = book.plain.get(&node).cloned().unwrap_or_default();
            self.publish(&mut book, &node, plain);
        }
    }

    /// The nodes holding any of the jobs `keys` made again (their registry logins changed).
    pub fn refresh_jobs(&self, keys: &BTreeSet<String>) {
        let mut book = self.lock();
        let nodes: Vec<String> = book
            .plain
            .iter()
            .filter(|(_, plain)| keys.iter().any(|key| plain.jobs.contains_key(key)))
            .map(|(node, _)| node.clone())
            .collect();
        for node in nodes {
            let plain = book.plain.get(&node).cloned().unwrap_or_default();
            self.publish(&mut book, &node, plain);
        }
    }

    /// Keeps `plain` as `node`'s state and sends it with its jobs' registry logins and the node's
    /// offers, if it changed.
    fn publish(&self, book: &mut Book, node: &str, plain: NodeDesired) {
        let authed = match &self.pull_secrets {
            Some(pull_secrets) => with_registry_auth(&plain, pull_secrets),
            None => plain.clone(),
        };
        let next = match book.platforms.get(node) {
            Some(platform) => with_offers(&authed, platform, self.artifacts.as_ref()),
            None => authed,
        };
        book.plain.insert(node.to_owned(), plain);
        match book.nodes.get(node) {
            Some(sender) => {
                sender.send_if_modified(|current| {
                    let changed = **current != next;
                    if changed {
                        *current = Arc::new(next);
                    }
                    changed
                });
            }
            None => {
                book.nodes.insert(node.to_owned(), watch::channel(Arc::new(next)).0);
            }
        }
    }

    /// The nodes that hold jobs and have no session (no connection follows their state), with
    /// the keys of their jobs.
    pub fn without_session(&self) -> BTreeMap<String, Vec<String>> {
        let book = self.lock();
        book.nodes
            .iter()
            .filter(|(_, sender)| sender.receiver_count() == 0)
            .map(|(node, sender)| (node.clone(), sender.borrow().jobs.keys().cloned().collect::<Vec<_>>()))
            .filter(|(_, jobs)| !jobs.is_empty())
            .collect()
    }

    pub fn subscribe(&self, node: &str) -> watch::Receiver<Arc<NodeDesired>> {
        let mut book = self.lock();
        book.nodes.entry(node.to_owned()).or_insert_with(|| watch::channel(Arc::default()).0).subscribe()
    }

    /// A piece of an artifact compiled for the nodes, to `node` if its desired state offers it:
    /// an artifact is not anyone's to fetch by its digest (a private policy's compile is its
    /// jobs' nodes' only).
    pub async fn artifact_chunk(
        &self,
        node: &str,
        sha256: &str,
        offset: u64,
        max: usize,
    ) -> Result<ArtifactPiece, String> {
        let offered = self.lock().nodes.get(node).is_some_and(|sender| offers(&sender.borrow(), sha256));
        if !offered {
            return Err(format!("the artifact {sha256} is not offered to node {node} (any more)"));
        }
        match &self.artifacts {
            Some(artifacts) => artifacts.chunk(sha256, offset, max).await,
            None => Err("this operator compiles no policies for nodes (it has no --sign-key)".into()),
        }
    }
}

/// Whether a job of `desired` is offered the ready artifact `sha256`.
fn offers(desired: &NodeDesired, sha256: &str) -> bool {
    desired.jobs.values().any(|job| {
        let offers = job.pointer("/config/policyArtifacts");
        offers
            .as_ref()
            .and_then(Value::as_object)
            .is_some_and(|offers| offers.values().any(|offer| offer["artifactSha256"] == sha256))
    })
}

/// `desired` with, in each job's config, the job's registry logins (`registryAuth`) if it has
/// some: a copy of those jobs only.
fn with_registry_auth(desired: &NodeDesired, pull_secrets: &PullSecrets) -> NodeDesired {
    let mut desired = desired.clone();
    for (key, job) in desired.jobs.iter_mut() {
        // Most jobs have no logins: not parsed.
        if !pull_secrets.holds(key) {
            continue;
        }
        let mut value = job.value();
        let uid = value.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_owned);
        let Some(auth) = pull_secrets.auth_of(key, uid.as_deref()) else { continue };
        if let Some(config) = value.get_mut("config").and_then(Value::as_object_mut) {
            config.insert("registryAuth".into(), serde_json::to_value(&*auth).unwrap_or_default());
            *job = DesiredObject::new(&value);
        }
    }
    desired
}

/// Makes the desired state of the nodes of a job whose registry logins changed again.
pub async fn follow_pull_secrets(book: Arc<NodeBook>) {
    let Some(pull_secrets) = book.pull_secrets.clone() else { return };
    loop {
        let changed = pull_secrets.changed().await;
        book.refresh_jobs(&changed);
    }
}

/// `desired` with, in each job's config, the offer of each of its policies for `platform`.
fn with_offers(desired: &NodeDesired, platform: &PolicyPlatform, artifacts: Option<&Arc<Artifacts>>) -> NodeDesired {
    let mut desired = desired.clone();
    for job in desired.jobs.values_mut() {
        let mut value = job.value();
        let Some(Ok(config)) = value.get("config").map(JobConfig::deserialize) else { continue };
        let mut offers = BTreeMap::new();
        for reference in config.policy_plugins() {
            if offers.contains_key(&reference.plugin) {
                continue;
            }
            // The job's login for the registry of an oci:// reference: the compile pulls with it.
            let login = match perennial_types::parse_source(&reference.plugin) {
                Ok(perennial_types::Source::Oci(oci)) => config.registry_auth.login(&oci.registry),
                _ => None,
            };
            let offer = match artifacts {
                Some(artifacts) => artifacts.offer(&reference, platform, login),
                // A node that compiles runs its jobs without the operator's compiles.
                None if platform.compiles => None,
                None => Some(PolicyArtifact::Refused {
                    reason: "this operator compiles no policies for nodes: give it --sign-key (a node without a \
                             compiler runs only signed artifacts)"
                        .into(),
                }),
            };
            if let Some(offer) = offer {
                offers.insert(reference.plugin.clone(), offer);
            }
        }
        if !offers.is_empty() {
            // A copy of this job for this node's platform; the plain one stays shared.
            value["config"]["policyArtifacts"] = serde_json::to_value(offers).unwrap_or_default();
            *job = DesiredObject::new(&value);
        }
    }
    desired
}

/// Makes the nodes' offers again each time a compile finishes, and every minute (a compile
/// refused for a reason that may pass, a fetch that failed, is tried again then).
pub async fn follow_compiles(book: Arc<NodeBook>) {
    let Some(mut finished) = book.artifacts.as_ref().map(|artifacts| artifacts.finished()) else { return };
    let mut again = tokio::time::interval(RETRY_REFUSED);
    again.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            changed = finished.changed() => if changed.is_err() { return },
            _ = again.tick() => {}
        }
        book.refresh();
    }
}

/// Edge reports into job and dataset status.
pub struct OperatorSide {
    pub book: Arc<NodeBook>,
    pub inbox: Arc<Inbox>,
    pub client: Client,
    /// The policies' writes are remembered with the reconciler's: its next status write is made
    /// from the newest version, not refused as a conflict with this one.
    written_jobs: Arc<WrittenJobs>,
    /// The watches' copies, to skip a write that would change nothing (a report resent after a
    /// reconnect or an edge restart).
    stores: Option<Stores>,
    /// The highest report applied per node since this operator started. After a restart it is
    /// 0: the edge resends what it holds, and the stage machine takes each report once.
    watermarks: Mutex<HashMap<String, u64>>,
    /// Job reports offered before their turn: the next stage's Ready that a stage result
    /// waits for goes to the inbox early, and its turn awaits that receipt.
    early: EarlyReports,
}

impl OperatorSide {
    pub fn new(book: Arc<NodeBook>, inbox: Arc<Inbox>, client: Client, written_jobs: Arc<WrittenJobs>) -> OperatorSide {
        OperatorSide {
            book,
            inbox,
            client,
            written_jobs,
            stores: None,
            watermarks: Mutex::default(),
            early: EarlyReports::default(),
        }
    }

    /// Reads the watches' copies (`stores`) to skip writes that change nothing.
    pub fn with_stores(self, stores: Stores) -> OperatorSide {
        OperatorSide { stores: Some(stores), ..self }
    }

    /// The job's status as the watch (or a write here) shows it, if it is the job of `uid`.
    fn stored_status(&self, namespace: &str, name: &str, uid: Option<&str>) -> Option<LifelongLearningJobStatus> {
        let stored = self.stores.as_ref()?.jobs.get(&ObjectRef::new(name).within(namespace))?;
        let job = self.written_jobs.newest(&stored);
        if uid.is_some_and(|uid| job.metadata.uid.as_deref() != Some(uid)) {
            return None;
        }
        Some(job.status.unwrap_or_default())
    }

    async fn apply_job(&self, node: &str, seq: u64, body: Value) -> Applied {
        let early = self.early.take(node, seq, &body);
        let report: Report = match serde_json::from_value(body) {
            Ok(report) => report,
            Err(err) => return Applied::Rejected(format!("not a job report: {err}")),
        };
        let Some((namespace, name)) = report.job.split_once('/') else {
            return Applied::Rejected(format!("job {:?} is not namespace/name", report.job));
        };
        let receipt = match early {
            Some(receipt) => receipt,
            None => {
                let receipt = self.inbox.deliver(namespace, name, perennial_lifecycle::Report::from(&report));
                if report.next_follows {
                    self.early.hand_in_follower(&self.inbox, node, namespace, name);
                }
                receipt
            }
        };
        let mut receipt = receipt;
        let written = match tokio::time::timeout(APPLY_SLOW, &mut receipt).await {
            Ok(written) => written,
            Err(_) => {
                tracing::debug!(node, job = report.job, "a report waits past {APPLY_SLOW:?} for its status write");
                match tokio::time::timeout(APPLY_GIVE_UP - APPLY_SLOW, receipt).await {
                    Ok(written) => written,
                    Err(_) => {
                        let why = format!("job {}'s status was not written within {APPLY_GIVE_UP:?}", report.job);
                        return Applied::Failed(why);
                    }
                }
            }
        };
        match written {
            Ok(()) => Applied::Applied,
            Err(_) => Applied::Rejected(format!("job {} was deleted before the report was applied", report.job)),
        }
    }

    /// The job's policies as its edge runs them: `status.policies`, replaced whole (a kind no
    /// longer there is removed). The stage machine never writes them, so no conflict with it.
    async fn apply_policies(&self, node: &str, body: Value) -> Applied {
        let key = body.get("job").and_then(Value::as_str).unwrap_or_default();
        // A job deleted and made again under its name is another job: the former one's policies
        // (its last decision, its failing plugin) are not the new one's.
        let reported_uid = body.get("jobUid").and_then(Value::as_str);
        let desired = self.book.subscribe(node).borrow().clone();
        let current_uid = desired.jobs.get(key).and_then(|job| job.pointer("/metadata/uid"));
        if let (Some(reported), Some(current)) = (reported_uid, current_uid.as_ref().and_then(Value::as_str))
            && reported != current
        {
            return Applied::Rejected(format!(
                "job {key}: its policies were reported for uid {reported}, a job since deleted (the job now is uid {current})"
            ));
        }
        let Some((namespace, name)) = key.split_once('/') else {
            return Applied::Rejected(format!("job {key:?} is not namespace/name"));
        };
        let Some(reported) = body.get("policies").and_then(Value::as_object) else {
            return Applied::Rejected(format!("job {key}: policies is not an object"));
        };
        let reported = canonical_policies(reported);
        let stored = self.stored_status(namespace, name, reported_uid);
        let stored_policies = stored.as_ref().and_then(|status| serde_json::to_value(&status.policies).ok());
        let policies = policies_patch(stored_policies.as_ref(), &reported);
        let fault = body.get("fault");
        let same_fault = stored.is_some_and(|status| fault.is_none_or(|f| f.as_str() == status.fault.as_deref()));
        if stored_policies.is_some() && policies == serde_json::json!({}) && same_fault {
            return Applied::Applied; // no write that changes nothing
        }
        let jobs: Api<LifelongLearningJob> = Api::namespaced(self.client.clone(), namespace);
        let mut status = serde_json::json!({"policies": policies});
        // The edge's repeating error (null clears it); an edge that never sends one leaves it.
        if let Some(fault) = fault {
            status["fault"] = fault.clone();
        }
        let patch = serde_json::json!({"status": status});
        match jobs.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(written) => {
                self.written_jobs.wrote(written);
                Applied::Applied
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Applied::Rejected(format!("job {key} is gone")),
            Err(err) => Applied::Failed(format!("job {key}: writing its policies: {err}")),
        }
    }

    async fn apply_dataset(&self, body: Value) -> Applied {
        let key = body.get("dataset").and_then(Value::as_str).unwrap_or_default();
        let Some(samples) = body.get("numberOfSamples").and_then(Value::as_u64) else {
            return Applied::Rejected(format!("dataset {key}: numberOfSamples is missing or not a count"));
        };
        let Some((namespace, name)) = key.split_once('/') else {
            return Applied::Rejected(format!("dataset {key:?} is not namespace/name"));
        };
        let stored = self.stores.as_ref().and_then(|s| s.datasets.get(&ObjectRef::new(name).within(namespace)));
        if stored.and_then(|d| d.status.as_ref().map(|s| s.number_of_samples)) == i64::try_from(samples).ok() {
            return Applied::Applied; // no write that changes nothing
        }
        match write_dataset_status(self.client.clone(), namespace, name, samples).await {
            Ok(()) => Applied::Applied,
            Err(super::reconcile::Error::Kube { source, .. }) if matches!(source.as_ref(), kube::Error::Api(status) if status.code == 404) => {
                Applied::Rejected(format!("dataset {key} is gone"))
            }
            Err(err) => Applied::Failed(err.to_string()),
        }
    }
}

impl CloudSide for OperatorSide {
    async fn last_applied_report(&self, node: &str) -> Result<u64, String> {
        // A new connection: what the last one offered comes again (a report already applied
        // with its result is then judged stale, never applied twice).
        self.early.forget_node(node);
        Ok(self.watermarks.lock().unwrap_or_else(|p| p.into_inner()).get(node).copied().unwrap_or(0))
    }

    fn queued(&self, node: &str, seq: u64, body: &Value) {
        self.early.offer(&self.inbox, node, seq, body);
    }

    async fn apply(&self, node: &str, seq: u64, body: Value) -> Applied {
        let outcome = if body.get("policies").is_some() {
            self.apply_policies(node, body).await
        } else if body.get("job").is_some() {
            self.apply_job(node, seq, body).await
        } else {
            self.apply_dataset(body).await
        };
        if outcome == Applied::Applied {
            let mut watermarks = self.watermarks.lock().unwrap_or_else(|p| p.into_inner());
            let mark = watermarks.entry(node.to_owned()).or_insert(0);
            *mark = (*mark).max(seq);
        }
        outcome
    }

    fn desired(&self, node: &str) -> watch::Receiver<Arc<NodeDesired>> {
        self.book.subscribe(node)
    }

    fn node_platform(&self, node: &str, platform: Option<&PolicyPlatform>) {
        self.book.set_platform(node, platform);
    }

    async fn artifact_chunk(&self, node: &str, sha256: &str, offset: u64, max: usize) -> Result<ArtifactPiece, String> {
        self.book.artifact_chunk(node, sha256, offset, max).await
    }

    fn artifact_sent(&self) {
        // A whole artifact went through this process a megabyte at a time (glibc keeps what a
        // thread freed): give it back. Off the runtime's threads: a trim walks every arena.
        tokio::task::spawn_blocking(perennial_artifact::child::release_freed_memory);
    }
}

/// The reported kinds as the status holds them: read through their type, so that a report and
/// the stored copy compare alike (a kind given as null is no kind).
fn canonical_policies(reported: &serde_json::Map<String, Value>) -> Value {
    let kinds: serde_json::Map<String, Value> =
        reported.iter().filter(|(_, policy)| !policy.is_null()).map(|(k, p)| (k.clone(), p.clone())).collect();
    serde_json::from_value::<perennial_types::PolicyStatuses>(Value::Object(kinds.clone()))
        .ok()
        .and_then(|typed| serde_json::to_value(typed).ok())
        .unwrap_or(Value::Object(kinds))
}

/// The merge patch of `status.policies` that makes it what the edge reported, each kind whole: a
/// member the stored copy has and the report has not (a kind gone, a shadow removed or promoted,
/// a message cleared) is removed, where a plain merge would keep it; `{}` when nothing differs.
/// Without a stored copy, the report with every kind it lacks removed.
fn policies_patch(stored: Option<&Value>, reported: &Value) -> Value {
    match stored {
        Some(stored) => super::patch::merge_diff(stored, reported).unwrap_or_else(|| serde_json::json!({})),
        None => {
            let mut patch = reported.clone();
            if let Some(kinds) = patch.as_object_mut() {
                for kind in ["trigger", "splitter", "selector"] {
                    kinds.entry(kind).or_insert(Value::Null);
                }
            }
            patch
        }
    }
}

/// Follows the cluster for the nodes' desired state: built whole once every watch has listed its
/// kind (then `ready` is sent: the link may open), then kept object by object as the watches
/// see changes; built whole again when a watch lists its kind again.
pub async fn follow_cluster(
    stores: Stores,
    mut changes: UnboundedReceiver<Seen>,
    book: Arc<NodeBook>,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut listed = BTreeSet::new();
    while listed.len() < 3 {
        match changes.next().await {
            Some(Seen::Listed(kind)) => {
                listed.insert(kind);
            }
            Some(_) => {}
            None => return,
        }
    }
    let build =
        |stores: &Stores| DesiredNodes::build(&stores.jobs.state(), &stores.datasets.state(), &stores.pods.state());
    let mut desired = build(&stores);
    book.replace_all(desired.nodes().clone());
    tracing::info!("the nodes' desired state is complete; the link opens");
    let _ = ready.send(());
    while let Some(first) = changes.next().await {
        // What queued meanwhile is applied in one go, each node published once.
        let mut batch = vec![first];
        while let Ok(more) = changes.try_recv() {
            batch.push(more);
        }
        if batch.iter().any(|seen| matches!(seen, Seen::Listed(_))) {
            desired = build(&stores);
            book.replace_all(desired.nodes().clone());
            continue;
        }
        let (jobs, datasets, pods) = (stores.jobs.state(), stores.datasets.state(), stores.pods.state());
        let mut touched = BTreeSet::new();
        for seen in batch {
            touched.extend(match seen {
                Seen::Job(job) => {
                    let key = perennial_api::key(&job.metadata);
                    let now = stores.jobs.get(&ObjectRef::from_obj(job.as_ref()));
                    desired.job_changed(&key, now.as_ref(), &datasets, &pods)
                }
                Seen::Dataset(dataset) => {
                    let key = perennial_api::key(&dataset.metadata);
                    let now = stores.datasets.get(&ObjectRef::from_obj(dataset.as_ref()));
                    desired.dataset_changed(&key, now.as_ref(), &jobs, &datasets, &pods)
                }
                Seen::Pod(pod) => match pod.metadata.labels.as_ref().and_then(|labels| labels.get(UID_LABEL)) {
                    Some(uid) => desired.pod_changed(uid, &jobs, &datasets, &pods),
                    None => BTreeSet::new(),
                },
                Seen::Listed(_) => BTreeSet::new(),
            });
        }
        for node in touched {
            book.set(&node, desired.node(&node));
        }
    }
}

/// Reads the static node tokens' Secret now and then (nodes outside the cluster); a missing
/// Secret means no such node may connect.
pub async fn follow_tokens(client: Client, options: LinkOptions, tokens: watch::Sender<Arc<NodeTokens>>) {
    let secrets: Api<Secret> = Api::namespaced(client, &options.tokens_namespace);
    let mut said_missing = false;
    // The version last read: an unchanged Secret wakes no connection (each one checks its token
    // again on a change, which at fleet size is thousands of wake-ups every refresh).
    let mut read_version: Option<String> = None;
    loop {
        match secrets.get_opt(&options.tokens_secret).await {
            Ok(Some(secret)) if read_version.is_some() && secret.metadata.resource_version == read_version => {}
            Ok(Some(secret)) => {
                read_version = secret.metadata.resource_version.clone();
                let pairs: Vec<(String, String)> = secret
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(node, token)| (node, String::from_utf8_lossy(&token.0).trim().to_owned()))
                    .collect();
                let count = pairs.len();
                tokens.send_replace(Arc::new(NodeTokens::new(pairs.iter().map(|(n, t)| (n.as_str(), t.as_str())))));
                tracing::debug!(nodes = count, "node tokens read");
                said_missing = false;
            }
            Ok(None) if !said_missing => {
                // Deleted: the tokens it held no longer admit anyone.
                read_version = None;
                tokens.send_replace(Arc::new(NodeTokens::new(std::iter::empty::<(&str, &str)>())));
                tracing::warn!(
                    "no Secret {}/{}: no node outside the cluster can connect until it exists (agents in the \
                     cluster open the link with their projected ServiceAccount token)",
                    options.tokens_namespace,
                    options.tokens_secret
                );
                said_missing = true;
            }
            Ok(None) => {}
            Err(err) => tracing::warn!("reading the node tokens: {err}"),
        }
        tokio::time::sleep(TOKENS_REFRESH).await;
    }
}

/// The listener's TLS from its certificate and key files (checked at start-up, before waiting
/// to lead).
pub fn load_tls(options: &LinkOptions) -> Result<Arc<ServerConfig>, LinkSetupError> {
    let read = |what: &'static str, path: &PathBuf| {
        std::fs::read(path).map_err(|err| LinkSetupError::File {
            what,
            path: path.display().to_string(),
            message: err.to_string(),
        })
    };
    let (cert, key) = (read("--link-cert", &options.cert_file)?, read("--link-key", &options.key_file)?);
    server_tls(&cert, &key).map_err(|err| LinkSetupError::File {
        what: "--link-cert/--link-key",
        path: options.cert_file.display().to_string(),
        message: err.to_string(),
    })
}

/// How long a new leader waits for its link port while another process still holds it.
const PORT_HELD_WAIT: Duration = Duration::from_secs(30);

/// Binds `address`; while it is in use (a former leader on this host, one port for the replicas,
/// that has not exited yet), tries again every second for up to `wait`, said once. A leader
/// that gave up at once led with no link until it was restarted.
async fn bind_when_free(address: SocketAddr, wait: Duration) -> Result<tokio::net::TcpListener, LinkSetupError> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut said = false;
    loop {
        match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => return Ok(listener),
            Err(source) if source.kind() == std::io::ErrorKind::AddrInUse && tokio::time::Instant::now() < deadline => {
                if !said {
                    tracing::warn!(%address, "the edge link's port is in use (a former leader still exiting?); trying again");
                    said = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(source) => return Err(LinkSetupError::Listen { address, source }),
        }
    }
}

/// Opens the listener and serves nodes until `stop`.
pub async fn listen(
    options: &LinkOptions,
    tls: Arc<ServerConfig>,
    tokens: watch::Receiver<Arc<NodeTokens>>,
    side: Arc<OperatorSide>,
    refusals: Arc<perennial_link::refusals::Refusals>,
    stop: watch::Receiver<bool>,
    listening: tokio::sync::oneshot::Sender<()>,
) -> Result<(), LinkSetupError> {
    let listener = bind_when_free(options.addr, PORT_HELD_WAIT).await?;
    tracing::info!(address = %options.addr, "the edge link listens");
    let _ = listening.send(());
    let reviewer = Arc::new(TokenReviewer::new(side.client.clone(), options.identity.clone()));
    // Sessions of an agent whose pod is gone end (the watch stops with the listener).
    let following = reviewer.follow_pods();
    tracing::info!(
        audience = options.identity.audience,
        service_account = options.identity.username(),
        "edge agents in the cluster open the link with their projected ServiceAccount token; static node tokens from \
         {}/{}",
        options.tokens_namespace,
        options.tokens_secret
    );
    let settings =
        ServerSettings { tls, tokens, reviewer: Some(reviewer), heartbeat_secs: options.heartbeat_secs, refusals };
    serve(listener, settings, side, stop).await;
    following.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A port held a moment (a former leader exiting) is taken once free; one held past the
    /// wait is an error that names it.
    #[tokio::test]
    async fn the_link_port_is_bound_once_a_former_holder_lets_it_go() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let address = held.local_addr().expect("its address");
        let freed = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            drop(held);
        });
        let listener = super::bind_when_free(address, std::time::Duration::from_secs(10)).await;
        assert_eq!(listener.expect("bound once free").local_addr().ok(), Some(address));
        freed.join().expect("the holder");

        let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let address = held.local_addr().expect("its address");
        let err = super::bind_when_free(address, std::time::Duration::from_secs(2)).await.expect_err("still held");
        assert!(err.to_string().contains(&address.to_string()), "{err}");
    }

    /// A report whose status write is slow (a burst of rounds at once) is waited for past
    /// [`APPLY_SLOW`], the connection kept, and answered as applied once written; one whose job
    /// goes meanwhile is refused, not left waiting.
    #[tokio::test(start_paused = true)]
    async fn a_report_waiting_past_the_slow_mark_keeps_its_connection_and_is_applied_once_written() {
        let (inbox, _woken) = Inbox::new();
        let inbox = Arc::new(inbox);
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a url"));
        let client = Client::try_from(config).expect("a client");
        let side = Arc::new(OperatorSide::new(
            Arc::new(NodeBook::default()),
            inbox.clone(),
            client,
            Arc::new(WrittenJobs::default()),
        ));
        let report = |round| Report {
            job: "ml/thermal".into(),
            job_uid: "u1".into(),
            round,
            phase: perennial_types::Stage::Train,
            status: perennial_types::Phase::Ready,
            input: None,
            output: None,
            reason: None,
            next_follows: false,
        };
        let body = serde_json::to_value(report(1)).expect("json");
        let waiting = tokio::spawn({
            let side = side.clone();
            async move { side.apply_job("edge-1", 1, body).await }
        });
        tokio::time::sleep(APPLY_SLOW * 3).await;
        assert!(!waiting.is_finished(), "still waiting for the write, the connection kept");
        assert_eq!(inbox.peek("ml", "thermal").len(), 1, "the report is in the inbox meanwhile");
        inbox.applied("ml", "thermal", 1);
        assert_eq!(waiting.await.expect("join"), Applied::Applied);

        let body = serde_json::to_value(report(2)).expect("json");
        let waiting = tokio::spawn({
            let side = side.clone();
            async move { side.apply_job("edge-1", 2, body).await }
        });
        tokio::time::sleep(APPLY_SLOW * 2).await;
        inbox.forget("ml", "thermal");
        let refused = waiting.await.expect("join");
        assert!(matches!(&refused, Applied::Rejected(why) if why.contains("deleted")), "{refused:?}");

        // One never written (its job refused meanwhile) does not hold the node's later reports
        // for ever: at the bound the connection ends, and the edge resends after its resync.
        let body = serde_json::to_value(report(3)).expect("json");
        let waiting = tokio::spawn({
            let side = side.clone();
            async move { side.apply_job("edge-1", 3, body).await }
        });
        tokio::time::sleep(APPLY_GIVE_UP - Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "still waiting just before the bound");
        let ended = waiting.await.expect("join");
        assert!(matches!(&ended, Applied::Failed(why) if why.contains("not written within")), "{ended:?}");
    }

    fn holding(job: &str) -> NodeDesired {
        let mut desired = NodeDesired::default();
        desired.jobs.insert(job.into(), json!({"metadata": {"namespace": "ml", "name": job}}).into());
        desired
    }

    #[test]
    fn a_reported_kind_replaces_the_stored_one_whole() {
        let stored = json!({
            "trigger": {"plugin": "builtin:threshold-trigger", "health": "Failing", "message": "trapped",
                        "shadow": {"plugin": "file:///new.wasm", "calls": 40}},
            "selector": {"plugin": "builtin:first-select", "health": "Serving"}
        });
        let reported = json!({
            "trigger": {"plugin": "file:///new.wasm", "health": "Serving"},
            "selector": {"plugin": "builtin:first-select", "health": "Serving"}
        });
        let patch = policies_patch(Some(&stored), &reported);
        assert_eq!(
            patch,
            json!({"trigger": {"plugin": "file:///new.wasm", "health": "Serving", "message": null, "shadow": null}}),
            "the promoted shadow and the old message go; the selector is not written again"
        );
        let mut after = stored.clone();
        super::super::patch::merge_apply(&mut after, &patch);
        assert_eq!(after, json!({"trigger": reported["trigger"].clone(), "selector": reported["selector"].clone()}));
        assert_eq!(policies_patch(Some(&after), &reported), json!({}), "the same again: nothing to write");
        let mut whole = reported.clone();
        whole["splitter"] = Value::Null;
        assert_eq!(policies_patch(None, &reported), whole, "no stored copy: the report, the kinds it lacks removed");
    }

    #[test]
    fn a_nodes_connection_hears_of_its_changes_only() {
        let book = NodeBook::default();
        let mut early = book.subscribe("edge-1");
        assert_eq!(**early.borrow_and_update(), NodeDesired::default(), "a node not yet known holds nothing");
        book.replace_all(BTreeMap::from([("edge-1".into(), holding("a")), ("edge-2".into(), holding("b"))]));
        assert!(early.has_changed().unwrap());
        assert_eq!(**early.borrow_and_update(), holding("a"));
        let mut other = book.subscribe("edge-2");
        assert_eq!(**other.borrow_and_update(), holding("b"));
        // The same state again: nobody is woken.
        book.replace_all(BTreeMap::from([("edge-1".into(), holding("a")), ("edge-2".into(), holding("b"))]));
        assert!(!early.has_changed().unwrap() && !other.has_changed().unwrap());
        // edge-2's job is gone: it is told it holds nothing; edge-1 hears nothing.
        book.replace_all(BTreeMap::from([("edge-1".into(), holding("a"))]));
        assert!(!early.has_changed().unwrap());
        assert!(other.has_changed().unwrap());
        assert_eq!(**other.borrow_and_update(), NodeDesired::default());
    }

    fn with_config(job: &str) -> NodeDesired {
        let config = JobConfig {
            name: format!("ml/{job}"),
            uid: "u".into(),
            spec: Default::default(),
            splitter: None,
            trigger: perennial_types::PolicyRef::new("/opt/policies/mine.wasm"),
            selector: perennial_types::PolicyRef::new("builtin:first-select"),
            fallback_trigger: None,
            policy_artifacts: BTreeMap::new(),
            registry_auth: Default::default(),
        };
        let mut desired = NodeDesired::default();
        let object = json!({"metadata": {"namespace": "ml", "name": job}, "config": config});
        desired.jobs.insert(format!("ml/{job}"), object.into());
        desired
    }

    #[test]
    fn a_jobs_registry_logins_reach_its_node_only_and_follow_each_change() {
        use perennial_types::{Password, RegistryAuth, RegistryLogin};
        let pull_secrets = Arc::new(PullSecrets::default());
        let book = NodeBook::default().with_pull_secrets(pull_secrets.clone());
        let mut job = with_config("a");
        let held = job.jobs.get_mut("ml/a").unwrap();
        let mut value = held.value();
        value["metadata"]["uid"] = json!("u1");
        *held = value.into();
        book.set("edge-1", job);
        book.set("edge-2", with_config("b"));
        let (mut one, two) = (book.subscribe("edge-1"), book.subscribe("edge-2"));
        let auth_of = |seen: &mut watch::Receiver<Arc<NodeDesired>>, key: &str| {
            seen.borrow_and_update().jobs[key].value()["config"].get("registryAuth").cloned()
        };
        assert_eq!(auth_of(&mut one, "ml/a"), None);
        let login =
            RegistryLogin { secret: "ml/regcred".into(), username: "ann".into(), password: Password::new("pw") };
        let auth = RegistryAuth { logins: BTreeMap::from([("127.0.0.1:5000".into(), login)]), ..Default::default() };
        pull_secrets.set("ml/a", "u1", auth);
        book.refresh_jobs(&BTreeSet::from(["ml/a".to_owned()]));
        assert!(one.has_changed().unwrap() && !two.has_changed().unwrap(), "only the job's node hears of it");
        let sent = auth_of(&mut one, "ml/a").expect("the logins");
        assert_eq!(sent["logins"]["127.0.0.1:5000"]["password"], "pw");
        // Made again under its name (another uid): not its logins.
        pull_secrets.set("ml/a", "u2", RegistryAuth { problems: vec!["x".into()], ..Default::default() });
        book.refresh_jobs(&BTreeSet::from(["ml/a".to_owned()]));
        assert_eq!(auth_of(&mut one, "ml/a"), None);
    }

    #[test]
    fn a_node_fetches_only_the_artifacts_offered_to_it() {
        let sha = "ab".repeat(32);
        let mut offered = with_config("a");
        let ready =
            json!({"state": "ready", "componentSha256": "c", "artifactSha256": sha, "size": 3, "platform": "p"});
        let job = offered.jobs.get_mut("ml/a").expect("the job");
        let mut value = job.value();
        value["config"]["policyArtifacts"] = json!({"oci://r/p@sha256:c": ready});
        *job = value.into();
        let book = NodeBook::default();
        book.set("edge-1", offered);
        book.set("edge-2", with_config("b"));
        let fetch = |node: &'static str, sha: String| {
            let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
            runtime.block_on(book.artifact_chunk(node, &sha, 0, 10)).expect_err("this book has no artifacts")
        };
        let refused = fetch("edge-2", sha.clone());
        assert!(refused.contains("not offered to node edge-2"), "{refused}");
        assert!(fetch("edge-1", "cd".repeat(32)).contains("not offered"), "another artifact");
        assert!(fetch("edge-3", sha.clone()).contains("not offered"), "an unknown node");
        // Offered: on to the artifacts (which this operator, without --sign-key, does not have).
        let passed = fetch("edge-1", sha);
        assert!(passed.contains("compiles no policies"), "{passed}");
    }

    #[test]
    fn a_node_that_says_its_platform_gets_an_offer_per_policy_and_others_get_none() {
        let book = NodeBook::default();
        book.set("edge-1", with_config("a"));
        let mut seen = book.subscribe("edge-1");
        let offers = |seen: &mut watch::Receiver<Arc<NodeDesired>>| {
            seen.borrow_and_update().jobs["ml/a"].value()["config"].get("policyArtifacts").cloned()
        };
        assert_eq!(offers(&mut seen), None, "a node that said nothing gets its jobs as they are");
        // A compiling node, and an operator that compiles nothing: the node compiles itself.
        let compiling = PolicyPlatform { platform: "pulley64".into(), fingerprint: "f".into(), compiles: true };
        book.set_platform("edge-1", Some(&compiling));
        assert_eq!(offers(&mut seen), None);
        // A compiler-free node: each policy refused, with what to do.
        book.set_platform("edge-1", Some(&PolicyPlatform { compiles: false, ..compiling }));
        assert!(seen.has_changed().unwrap(), "the node hears of it");
        let offered = offers(&mut seen).expect("offers");
        for plugin in ["/opt/policies/mine.wasm", "builtin:first-select"] {
            assert_eq!(offered[plugin]["state"], "refused", "{offered}");
            let reason = offered[plugin]["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("give it --sign-key"), "{reason}");
        }
        // The node goes away without a platform: its jobs as they are again.
        book.set_platform("edge-1", None);
        assert_eq!(offers(&mut seen), None);
    }
}
