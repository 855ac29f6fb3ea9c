//! The operator (`perennial operator`): kube-rs's `Controller` over LifelongLearningJobs and the
//! pods they own, feeding the same stage machine as the embedded mode (`lifecycle`) and carrying
//! out its actions with the pod builder (`workers::pod`). The decisions are pure and tested
//! exhaustively; this module is the thin Kubernetes shell, tested against a mock API server
//! that checks the sequence of calls.

pub mod absent_nodes;
pub mod access;
pub mod api_requests;
pub mod artifacts;
pub mod client;
pub mod early_reports;
pub mod events;
pub mod identity;
pub mod inbox;
pub mod leader;
pub mod leader_label;
pub mod link;
pub mod metrics;
pub mod node_state;
pub mod observe;
pub mod patch;
pub mod pod_name;
pub mod pull_secrets;
pub mod reconcile;
pub mod running_hold;
pub mod scope;
pub mod stored_templates;
pub mod watches;
pub mod worker_pod;
pub mod written;

use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, controller};
use kube::{Client, ResourceExt};

pub use inbox::Inbox;
pub use metrics::Metrics;
use perennial_api::{Dataset, LifelongLearningJob};
use perennial_lifecycle::Settings;
pub use reconcile::{Context, WorkerDefaults};

/// How `perennial operator` runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// The namespaces watched: all, or the ones given (`--namespace a,b`).
    pub scope: scope::Scope,
    pub metrics_addr: SocketAddr,
    pub settings: Settings,
    pub workers: WorkerDefaults,
    /// Lease-based leader election (two replicas, one acts); `None`: act at once, alone.
    pub leader: Option<leader::LeaseSettings>,
    /// A client of its own for the Lease, so that its renewals never wait behind the operator's
    /// other calls ([`client::MAX_IN_FLIGHT`]); `None`: the operator's client.
    pub leader_client: Option<LeaseClient>,
    /// This replica's name in events (its pod name).
    pub instance: Option<String>,
    /// The edge link's listener; `None`: no edge nodes (reports come from nowhere).
    pub link: Option<link::LinkOptions>,
    /// How many of the newest rounds keep their finished Train and Eval pods; older rounds' pods
    /// are deleted once a round completes. 0 keeps them all (Sedna).
    pub finished_rounds_kept: u64,
    /// Above this many worker pods in a namespace, a Deploy deletes the pods it replaces by name
    /// ([`reconcile::DELETE_BY_NAME_PAST_PODS`] by default).
    pub delete_by_name_past: usize,
    /// This replica's own pod, `(namespace, name)`, when it runs in one: the leader labels it
    /// for the link's Service ([`leader_label`]).
    pub own_pod: Option<(String, String)>,
    /// What the client's answers say of the credentials ([`client::build`]), for the probes.
    pub api_health: Arc<client::ApiHealth>,
}

/// How to make the Lease's own client ([`OperatorOptions::leader_client`]), called on the Lease's
/// own thread ([`leader::LeaseThread`]).
#[derive(Clone)]
pub struct LeaseClient(pub Arc<dyn Fn() -> Result<Client, String> + Send + Sync>);

impl std::fmt::Debug for LeaseClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseClient")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("metrics endpoint {address}: {source}")]
    Metrics { address: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Leader(#[from] leader::LeaderError),
    #[error("starting the Lease's thread: {source}")]
    LeaseThread { source: std::io::Error },
    #[error(transparent)]
    Link(#[from] link::LinkSetupError),
}

/// Runs the operator until SIGTERM/Ctrl-C. A leader that loses its Lease exits the process
/// there and then (from the Lease's thread, status 1), and Kubernetes starts it again as a
/// standby; an error returned means it could not start or lead at all.
pub async fn run(client: Client, options: OperatorOptions) -> Result<(), OperatorError> {
    // One stop for the whole run, latched: a SIGTERM between two phases (waiting to lead, the
    // stores filling, reconciling) is not lost between their listeners.
    let stop = stop_latch();
    let metrics = Arc::new(Metrics::with_api(options.api_health.clone()));
    let listener = tokio::net::TcpListener::bind(options.metrics_addr)
        .await
        .map_err(|source| OperatorError::Metrics { address: options.metrics_addr, source })?;
    tracing::info!(address = %options.metrics_addr, "serving /metrics and /healthz");
    let served = metrics.clone();
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, metrics::router(served)).await {
            tracing::error!("metrics endpoint: {err}");
        }
    });

    // A bad certificate is said at once, not after winning the election.
    let link_tls = options.link.as_ref().map(link::load_tls).transpose()?;
    let make_client: leader::MakeClient = match options.leader_client {
        Some(own) => {
            let make = own.0.clone();
            Box::new(move || make())
        }
        None => {
            let shared = client.clone();
            Box::new(move || Ok(shared))
        }
    };
    let own_pod =
        options.own_pod.as_ref().map(|(namespace, name)| leader_label::OwnPod::new(client.clone(), namespace, name));
    if let Some(pod) = &own_pod {
        // Not Ready while the pod may still carry a former leader's label (a restarted container).
        retry("taking the leader's label off this replica's pod", || pod.step_down()).await;
    }
    // Only now: a replica still stepping down must not hold the Lease without acting.
    let mut elector = match options.leader.clone() {
        Some(settings) => Some(
            leader::LeaseThread::start(make_client, settings, Box::new(exit_on_lost_lease))
                .map_err(|source| OperatorError::LeaseThread { source })?,
        ),
        None => None,
    };
    metrics.set_ready(true);
    if let Some(lease) = elector.as_mut() {
        tracing::info!("waiting to become the leader");
        // A standby asked to stop (a rolling update, a drained node) stops now, not at the
        // kubelet's SIGKILL after its grace period, giving back a Lease a write in flight took.
        let stopped = tokio::select! {
            acquired = lease.acquire() => {
                acquired?;
                false
            }
            () = stopped(stop.clone()) => true,
        };
        if stopped {
            if let Some(lease) = elector.take() {
                lease.stop().await;
            }
            tracing::info!("stopped while waiting to become the leader");
            return Ok(());
        }
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::spawn(give_back_freed_memory());
    let (inbox, woken) = Inbox::new();
    // One watch per kind, followed by the Controller and the link alike.
    let (link_changes, changes) = match options.link {
        Some(_) => {
            let (sender, receiver) = futures::channel::mpsc::unbounded();
            (Some(sender), Some(receiver))
        }
        None => (None, None),
    };
    let written_jobs = Arc::new(written::WrittenJobs::counted_in(metrics.written_jobs_kept.clone()));
    let (stores, triggers) = watches::start(&client, &options.scope, link_changes, &written_jobs);
    let reporter = Reporter { controller: "perennial-operator".into(), instance: options.instance.clone() };
    let context = Arc::new(Context {
        client: client.clone(),
        settings: options.settings,
        workers: options.workers.clone(),
        inbox: Arc::new(inbox),
        stores: stores.clone(),
        events: events::Events::start(client.clone(), reporter, metrics.clone()),
        metrics: metrics.clone(),
        failures: Default::default(),
        written: Default::default(),
        written_jobs,
        finished_rounds_kept: options.finished_rounds_kept,
        delete_by_name_past: options.delete_by_name_past,
        pull_secrets: Default::default(),
        running_holds: Default::default(),
    });
    let stop_link = match (&options.link, link_tls, changes) {
        (Some(options), Some(tls), Some(changes)) => {
            Some(start_link(&client, options.clone(), tls, &context, stores.clone(), changes, own_pod.clone()))
        }
        _ => None,
    };
    if options.link.is_none() {
        metrics.set_serving(true);
        if let Some(pod) = own_pod.clone() {
            tokio::spawn(async move { retry("labelling this replica's pod as the leader's", || pod.lead()).await });
        }
    }
    let reports = futures::stream::unfold(woken, |mut woken| async move { woken.recv().await.map(|job| (job, woken)) });
    let known = stores.jobs.clone();
    // As many reconciles at once as the client sends calls: more would only wait for the
    // client, each holding its job's copies (a takeover at fleet size reconciles every job).
    let at_once = u16::try_from(client::MAX_IN_FLIGHT).unwrap_or(u16::MAX);
    // A Dataset created or changed after its jobs (its node, its credential) wakes them.
    let reconciles = Controller::for_stream(triggers.jobs, stores.jobs.clone())
        .with_config(controller::Config::default().concurrency(at_once))
        .owns_stream(triggers.pods)
        .watches_stream(triggers.datasets, move |dataset| jobs_of_dataset(&known.state(), &dataset))
        .reconcile_on(reports)
        .graceful_shutdown_on(stopped(stop))
        .run(reconcile::reconcile, reconcile::error_policy, context)
        .for_each(|result| async move {
            match result {
                Ok((job, _)) => tracing::debug!(job = %job, "reconciled"),
                Err(err) => tracing::debug!("reconcile: {err}"),
            }
        });
    // The Controller waits for the jobs' store; a reconcile reads pods and Datasets from theirs,
    // which must be complete too (a pod not yet listed would be taken for a vanished one).
    let controller = async {
        let _ = stores.pods.wait_until_ready().await;
        let _ = stores.datasets.wait_until_ready().await;
        reconciles.await;
    };
    tracing::info!(namespaces = options.scope.describe(), "reconciling LifelongLearningJobs");
    match elector {
        None => controller.await,
        Some(elector) => {
            if let Err(lost) = elector.lead(controller).await {
                metrics.set_healthy(false);
                return Err(lost.into());
            }
        }
    }
    if let Some(stop) = stop_link {
        stop.send_replace(true);
    }
    tracing::info!("stopped");
    Ok(())
}

/// The Lease is lost (another replica holds it, or it was not renewed in time): stop at once,
/// from the Lease's own thread, so that nothing this process has queued acts past the moment
/// the other replica may take over. The process manager starts it again, as the standby.
fn exit_on_lost_lease(lost: &leader::LeaderError) {
    tracing::error!("{lost}; exiting so that only the new leader acts");
    std::process::exit(1);
}

/// Ctrl-C or SIGTERM (the kubelet, systemd), listened for from now on and kept once heard.
fn stop_latch() -> tokio::sync::watch::Receiver<bool> {
    let (heard, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        perennial_link::stop_signal::stop_signal().await;
        tracing::info!("stopping (a signal)");
        heard.send_replace(true);
        // Kept: the latch stays readable.
        std::future::pending::<()>().await;
    });
    stop
}

/// Resolves once the stop is heard (at once if it was already).
async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    if stop.wait_for(|stopped| *stopped).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// How often the heap's free pages are given back to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const GIVE_BACK_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// glibc keeps in its heaps what a burst freed (a takeover's reconciles of every job, a fleet's
/// TLS handshakes and first desired states), so the operator's RSS stayed at the burst's high
/// water mark, a few times what it holds. Given back every half minute (a few milliseconds).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
async fn give_back_freed_memory() {
    let mut every = tokio::time::interval(GIVE_BACK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let _ = tokio::task::spawn_blocking(perennial_artifact::child::release_freed_memory).await;
    }
}

/// The edge link, on the leader: the nodes' desired state followed, their tokens read, and the
/// listener opened once the desired state is complete (ready from then on). Returns its stop.
fn start_link(
    client: &Client,
    options: link::LinkOptions,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    context: &Context,
    stores: watches::Stores,
    changes: futures::channel::mpsc::UnboundedReceiver<watches::Seen>,
    own_pod: Option<leader_label::OwnPod>,
) -> tokio::sync::watch::Sender<bool> {
    let book = match &options.artifacts {
        Some(artifacts) => link::NodeBook::compiling(artifacts.clone()),
        None => link::NodeBook::default(),
    };
    let book = Arc::new(book.with_pull_secrets(context.pull_secrets.clone()));
    tokio::spawn(link::follow_compiles(book.clone()));
    tokio::spawn(link::follow_pull_secrets(book.clone()));
    let (complete, completed) = tokio::sync::oneshot::channel();
    tokio::spawn(link::follow_cluster(stores.clone(), changes, book.clone(), complete));
    let (tokens, read_tokens) = tokio::sync::watch::channel(Arc::new(perennial_link::socket::NodeTokens::default()));
    tokio::spawn(link::follow_tokens(client.clone(), options.clone(), tokens));
    let said_absent = (book.clone(), stores.clone(), context.events.clone());
    let logins = (client.clone(), book.clone(), stores.clone(), context.pull_secrets.clone());
    let side = link::OperatorSide::new(book, context.inbox.clone(), client.clone(), context.written_jobs.clone());
    let side = Arc::new(side.with_stores(stores));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let metrics = context.metrics.clone();
    tokio::spawn(async move {
        if completed.await.is_err() {
            return;
        }
        // The nodes' first state carries their jobs' registry logins: read before the link opens.
        let (client, book, stores, pull_secrets) = logins;
        let with_logins = pull_secrets::resolve_all(&client, &stores.jobs.state(), &pull_secrets).await;
        book.refresh_jobs(&with_logins);
        // From when the link opens: a node that holds jobs and does not connect is said on them.
        let (book, stores, events) = said_absent;
        tokio::spawn(absent_nodes::say_absent_nodes(book, stores, events));
        let (listening, listened) = tokio::sync::oneshot::channel();
        let leading = metrics.clone();
        tokio::spawn(async move {
            if listened.await.is_err() {
                return;
            }
            leading.set_serving(true);
            if let Some(pod) = own_pod {
                retry("labelling this replica's pod as the leader's", || pod.lead()).await;
            }
        });
        let counted = metrics.clone();
        let refusals = Arc::new(perennial_link::refusals::Refusals::new(move |refusal| {
            counted.link_refusal(match refusal {
                perennial_link::refusals::Refusal::Refused => "refused",
                perennial_link::refusals::Refusal::Throttled => "throttled",
            })
        }));
        if let Err(err) = link::listen(&options, tls, read_tokens, side, refusals, stopped, listening).await {
            tracing::error!("{err}");
            metrics.set_serving(false);
            metrics.set_ready(false);
        }
    });
    stop
}

/// `call` until it succeeds, every 2 s; its failure said once, and when it succeeds after all.
async fn retry<F, Fut>(what: &str, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    let mut failures = 0u32;
    loop {
        match call().await {
            Ok(()) => {
                if failures > 0 {
                    tracing::info!(failures, "{what}: done after all");
                }
                return;
            }
            Err(err) => {
                if failures == 0 {
                    tracing::error!("{what}: {err}; trying again every 2 s");
                }
                failures = failures.saturating_add(1);
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}

/// The jobs that use `dataset` (same namespace, `spec.dataset.name`).
pub fn jobs_of_dataset(jobs: &[Arc<LifelongLearningJob>], dataset: &Dataset) -> Vec<ObjectRef<LifelongLearningJob>> {
    let (namespace, name) = (dataset.namespace(), dataset.name_any());
    jobs.iter()
        .filter(|job| job.namespace() == namespace && job.spec.dataset.name == name)
        .map(|job| ObjectRef::from_obj(job.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dataset_wakes_the_jobs_that_use_it() {
        let job = |namespace: &str, name: &str, dataset: &str| {
            let value = serde_json::json!({
                "apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"dataset": {"name": dataset, "trainProb": 0.8},
                         "trainSpec": {"template": {}, "trigger": {}}, "evalSpec": {"template": {}},
                         "deploySpec": {"template": {}}, "outputDir": "/o"}
            });
            Arc::new(serde_json::from_value::<LifelongLearningJob>(value).expect("job"))
        };
        let jobs = vec![job("ml", "a", "d"), job("ml", "b", "other"), job("lab", "c", "d"), job("ml", "e", "d")];
        let dataset: Dataset = serde_json::from_value(serde_json::json!({
            "apiVersion": "sedna.io/v1alpha1", "kind": "Dataset", "metadata": {"name": "d", "namespace": "ml"},
            "spec": {"url": "/i", "format": "txt", "nodeName": "n"}
        }))
        .expect("dataset");
        let woken: Vec<String> = jobs_of_dataset(&jobs, &dataset).iter().map(|r| r.name.clone()).collect();
        assert_eq!(woken, ["a", "e"]);
    }
}
