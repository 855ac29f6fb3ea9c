//! `perennial operator`: the Kubernetes operator (in the cloud, usually two replicas from
//! `deploy/operator/`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use perennial_lifecycle::Settings;
use perennial_operator::artifacts::{ArtifactOptions, Artifacts};
use perennial_operator::identity::IdentitySettings;
use perennial_operator::link::LinkOptions;
use perennial_operator::{self as cloud, OperatorOptions, WorkerDefaults, leader::LeaseSettings};

#[derive(Args)]
pub struct OperatorArgs {
    /// A kubeconfig file; without it, the in-cluster service account (or `~/.kube/config`).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Watch only these namespaces, comma-separated (default: all namespaces). The namespaced
    /// install (deploy/operator-namespaced) sets it, with a Role in each of them.
    #[arg(long, env = "PERENNIAL_NAMESPACE", value_delimiter = ',')]
    namespace: Vec<String>,
    /// Where `/metrics` (Prometheus), `/healthz` and `/readyz` (the leader) are served.
    #[arg(long, env = "PERENNIAL_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// The operator's own image: worker pods' init containers run its `perennial fetch` to
    /// download S3 inputs.
    #[arg(long, env = "PERENNIAL_IMAGE", default_value = "ghcr.io/perennial-edge/perennial:0.1.0")]
    image: String,
    /// The edge agent's worker API as workers reach it (Sedna's `LC_SERVER`; host network).
    #[arg(long, env = "PERENNIAL_LC_SERVER", default_value = "http://localhost:9100")]
    lc_server: String,
    /// Sedna's `KB_SERVER`, given to train and eval workers.
    #[arg(long, env = "PERENNIAL_KB_SERVER", default_value = "http://localhost:9020")]
    kb_server: String,
    /// Act without a Lease (one replica only).
    #[arg(long, env = "PERENNIAL_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// The operator's own namespace: its Lease's.
    #[arg(long, env = "POD_NAMESPACE", default_value = "perennial-system")]
    lease_namespace: String,
    /// The Lease's name.
    #[arg(long, default_value = "perennial-operator")]
    lease_name: String,
    /// How long the Lease lasts unrenewed: the standby takes over this long after the leader's
    /// last renewal (kube-controller-manager's `--leader-elect-lease-duration`).
    #[arg(long, env = "PERENNIAL_LEASE_DURATION_SECS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    lease_duration_secs: u64,
    /// How long the leader goes on unrenewed before it exits: less than the lease, by enough
    /// for its exit and for the replicas' clocks to differ. Raise both where the API server is
    /// slow to answer in bursts (a large fleet's).
    #[arg(long, env = "PERENNIAL_LEASE_RENEW_DEADLINE_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    lease_renew_deadline_secs: u64,
    /// This replica's identity in the Lease and in events (its pod name; default the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// The pod this replica runs in (in the Lease's namespace), set by deploy/operator: the
    /// leader labels it `perennial.io/role=leader`, which the link's Service selects.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// Where the edge link listens (WebSocket over TLS); without it, no edge node connects.
    #[arg(long, env = "PERENNIAL_LINK_ADDR", requires_all = ["link_cert", "link_key"])]
    link_addr: Option<SocketAddr>,
    /// The link's TLS certificate chain (PEM), e.g. `tls.crt` of a mounted TLS Secret.
    #[arg(long, env = "PERENNIAL_LINK_CERT")]
    link_cert: Option<PathBuf>,
    /// The link's TLS private key (PEM).
    #[arg(long, env = "PERENNIAL_LINK_KEY")]
    link_key: Option<PathBuf>,
    /// The Secret holding each edge node's token, keyed by node name: `namespace/name`, or a
    /// name in the operator's namespace.
    #[arg(long, env = "PERENNIAL_LINK_TOKENS", default_value = "perennial-edge/perennial-edge-tokens")]
    link_tokens: String,
    /// The audience of the edge agents' projected ServiceAccount tokens (the DaemonSet's
    /// `serviceAccountToken` volume): the operator reviews them for it (TokenReview).
    #[arg(long, env = "PERENNIAL_LINK_AUDIENCE", default_value = perennial_operator::identity::DEFAULT_AUDIENCE)]
    link_audience: String,
    /// The edge agents' namespace: their ServiceAccount's and their pods'.
    #[arg(long, env = "PERENNIAL_EDGE_NAMESPACE", default_value = "perennial-edge")]
    edge_namespace: String,
    /// The edge agents' ServiceAccount: only its tokens (bound to an agent pod, whose node they
    /// prove) open the link without a static node token.
    #[arg(long, env = "PERENNIAL_EDGE_SERVICE_ACCOUNT", default_value = "perennial-edge")]
    edge_service_account: String,
    /// The ed25519 private key (PEM) the operator signs the policies it compiles for the nodes
    /// with (`perennial plugin keygen`); nodes trust its public half (`edge --trust-key`).
    /// Without it, the operator compiles nothing, and nodes compile their own policies.
    #[arg(long, value_name = "FILE", env = "PERENNIAL_SIGN_KEY", requires = "link_addr")]
    sign_key: Option<PathBuf>,
    /// Where the policies compiled for the nodes are kept (one file per component, platform and
    /// engine; they outlive a restart). Default: `perennial-artifacts` in the temporary folder.
    #[arg(long, value_name = "DIR", env = "PERENNIAL_ARTIFACT_DIR", requires = "sign_key")]
    artifact_dir: Option<PathBuf>,
    /// The link's heartbeat: a silent connection is dropped after two, in seconds.
    #[arg(long, default_value_t = perennial_link::DEFAULT_HEARTBEAT_SECS)]
    link_heartbeat_secs: u32,
    /// First wait before a failed round goes back to Train (doubling up to 360 s), in seconds.
    #[arg(long, default_value_t = 10)]
    retry_backoff_secs: u64,
    /// Restarts of a stage's worker beyond which the stage fails.
    #[arg(long, default_value_t = 3)]
    restart_limit: u32,
    /// How many of the newest rounds keep their finished Train and Eval pods (for `kubectl
    /// logs`): older rounds' pods are deleted as a round deploys (with the inference pod it
    /// replaces, in one request, or one a pod past `--delete-pods-by-name-past`) or completes. 0 keeps them all (Sedna).
    #[arg(long, env = "PERENNIAL_FINISHED_ROUNDS_KEPT", default_value_t = 2)]
    finished_rounds_kept: u64,
    /// Above this many worker pods in a namespace, a Deploy deletes the pods it replaces one by
    /// one by name (each a read of one pod), not with a deletecollection by label (which the API
    /// server answers by reading every pod of the namespace).
    #[arg(long, default_value_t = perennial_operator::reconcile::DELETE_BY_NAME_PAST_PODS)]
    delete_pods_by_name_past: usize,
}

pub async fn run(args: OperatorArgs) -> anyhow::Result<()> {
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("perennial-operator-{}", std::process::id()));
    // Bad flags are said before anything is read or started.
    let lease = (!args.no_leader_election).then(|| lease_settings(&args, &identity)).transpose()?;
    // The artifacts it sends the nodes pass through in megabyte buffers: never kept in the heap.
    cloud::artifacts::map_large_buffers_apart();
    // A socket per linked node: the container's default soft limit would cap the fleet.
    let (open_files, _) = perennial_link::open_files::raise_to_hard_limit();
    tracing::info!(open_files, "open-file limit (one per linked node, beside about a hundred of its own)");
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context("no in-cluster config and no kubeconfig (--kubeconfig)")?,
    };
    let api_health = std::sync::Arc::new(cloud::client::ApiHealth::default());
    // The Lease's own client (its own connections, not behind the others' limit).
    // Built here once so that a bad config is said at once; made again on the Lease's thread.
    let leader_client = match args.no_leader_election {
        true => None,
        false => {
            cloud::client::build(config.clone(), api_health.clone())?;
            let (config, health) = (config.clone(), api_health.clone());
            let make = move || cloud::client::build(config.clone(), health.clone()).map_err(|err| err.to_string());
            Some(cloud::LeaseClient(std::sync::Arc::new(make)))
        }
    };
    let client = cloud::client::build(config, api_health.clone())?;
    let backoff = Duration::from_secs(args.retry_backoff_secs.max(1));
    let artifacts = match &args.sign_key {
        Some(sign_key) => {
            let dir = args.artifact_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("perennial-artifacts"));
            // Compiles pause while the operator's calls to the API server go on.
            let give_way = api_health.give_way.clone();
            let options = ArtifactOptions { sign_key: sign_key.clone(), dir, give_way };
            Some(Artifacts::new(&options)?)
        }
        None => None,
    };
    let link = match (args.link_addr, args.link_cert, args.link_key) {
        (Some(addr), Some(cert_file), Some(key_file)) => Some(LinkOptions {
            addr,
            cert_file,
            key_file,
            tokens_namespace: match args.link_tokens.split_once('/') {
                Some((namespace, _)) => namespace.to_owned(),
                None => args.lease_namespace.clone(),
            },
            tokens_secret: args.link_tokens.rsplit('/').next().unwrap_or_default().to_owned(),
            identity: IdentitySettings {
                audience: args.link_audience,
                namespace: args.edge_namespace,
                service_account: args.edge_service_account,
                ..IdentitySettings::default()
            },
            heartbeat_secs: args.link_heartbeat_secs.max(1),
            artifacts,
        }),
        _ => None,
    };
    let own_pod = args.pod_name.clone().map(|pod| (args.lease_namespace.clone(), pod));
    let options = OperatorOptions {
        scope: perennial_operator::scope::Scope::new(&args.namespace),
        metrics_addr: args.metrics_addr,
        settings: Settings {
            backoff_base: backoff,
            backoff_max: Duration::from_secs(360).max(backoff),
            restart_limit: args.restart_limit,
            ..Settings::default()
        },
        workers: WorkerDefaults { lc_server: args.lc_server, kb_server: args.kb_server, fetch_image: args.image },
        leader: lease,
        leader_client,
        instance: Some(identity),
        link,
        finished_rounds_kept: args.finished_rounds_kept,
        delete_by_name_past: args.delete_pods_by_name_past,
        own_pod,
        api_health,
    };
    cloud::run(client, options).await?;
    Ok(())
}

/// The Lease's settings from the flags: renewed every 5 s (or twice within the renew deadline),
/// a standby looking every 2 s.
fn lease_settings(args: &OperatorArgs, identity: &str) -> anyhow::Result<LeaseSettings> {
    let (duration, deadline) = (args.lease_duration_secs, args.lease_renew_deadline_secs);
    if deadline < 2 || deadline >= duration {
        anyhow::bail!(
            "--lease-renew-deadline-secs ({deadline}) must be at least 2 and less than --lease-duration-secs \
             ({duration}): a leader must have stopped before a standby may take over"
        );
    }
    let renew_deadline = Duration::from_secs(deadline);
    Ok(LeaseSettings {
        duration: Duration::from_secs(duration),
        renew_deadline,
        renew_every: (renew_deadline / 2).min(Duration::from_secs(5)),
        retry_every: (renew_deadline / 2).min(Duration::from_secs(2)),
        ..LeaseSettings::new(args.lease_namespace.clone(), args.lease_name.clone(), identity.to_owned())
    })
}
