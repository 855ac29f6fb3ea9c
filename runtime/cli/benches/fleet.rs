//! A fleet of simulated edge nodes on one operator (issue #36): `cargo bench -p perennial --bench
//! fleet` with `PERENNIAL_BENCH_KUBECONFIG` naming an admin kubeconfig of a real API server (e.g.
//! `../shared/k8s/up --state /tmp/k8s-fleet --port 16600 --etcd-port 22600`, then
//! `PERENNIAL_BENCH_KUBECONFIG=/tmp/k8s-fleet/kubeconfig`) and `PERENNIAL_BENCH_NODES` nodes
//! (1000).
//!
//! Each node is the edge's own link client (real TLS, its own token) over an in-memory stand-in
//! for the edge's state (`tests/support/fleet.rs`); one Dataset and one job per node; a real
//! `perennial operator` as its ServiceAccount. Phases, each printed as one line of figures:
//!
//! - create: the Datasets and jobs made on the API server;
//! - connect: from the operator's start to every node connected and holding its job (the nodes
//!   run before it, retrying), and to every job's status written;
//! - idle: heartbeats only for `PERENNIAL_BENCH_IDLE_SECS` (60): the operator's RSS and CPU per
//!   minute, the link's bytes per node per second each way (the kernel's count on the operator's
//!   sockets: TLS records, WebSocket frames);
//! - policy: every job's trigger changed; the time until every node holds (serves) it;
//! - rounds: `PERENNIAL_BENCH_ROUND_SHARE` (1.0) of the nodes play one whole round (Train Ready
//!   to deployed, the bench playing the kubelet and the workers): API requests and kube-apiserver
//!   and etcd CPU seconds per job-round, the operator's RSS after. `PERENNIAL_BENCH_ROUNDS` runs
//!   several rounds phases, each on nodes that have not played yet: `10/1,100,1000,all/1000` is ten
//!   jobs alone one after another, 100 at once, 1,000 at once, then every other node in waves of
//!   1,000 (each wave started once the one before is deployed); a phase prefixed `again:` plays
//!   nodes that have played already (`again:all/1000`: every played node's second round, which
//!   deletes its first round's inference pod);
//! - churn: nodes drop and reconnect at `PERENNIAL_BENCH_CHURN_PER_SEC` (nodes / 100) for
//!   `PERENNIAL_BENCH_CHURN_SECS` (60), each with a report in flight;
//! - failover: a standby beside the leader, `PERENNIAL_BENCH_FAILOVER_SHARE` (0.1) of the nodes
//!   mid-round, the leader SIGKILLed, every node with a report queued while none leads: the time
//!   until the standby leads and until every node has resynced on it (through a Service that
//!   sends each connection to the leading replica), the new leader's reads meanwhile.
//!
//! Then the checks: no node that never connected, no report lost or doubled, the operator alive.
//! The nodes connect straight to the operator's link, or through the in-process Service when the
//! failover phase runs: three sockets a node in this process. The bench raises its open-file
//! limit to what that needs where it may (past the hard limit with CAP_SYS_RESOURCE); where it
//! may not (this machine's hard limit of 20,000 holds about 6,600 nodes through the Service), the
//! standby is given the leader's link port instead, which it binds once it leads.
//! `PERENNIAL_BENCH_ONLY=idle,policy,rounds,churn,failover` picks phases; `PERENNIAL_BENCH_BINARY` runs
//! another `perennial` binary; `PERENNIAL_BENCH_K8S_STATE` the `up` state directory (else the
//! kubeconfig's folder) for kube-apiserver's and etcd's CPU.

#[allow(dead_code)]
#[path = "support/api_server.rs"]
mod api_server;
#[allow(dead_code)]
#[path = "../../../tests/support/fleet.rs"]
mod fleet;
#[allow(dead_code)]
#[path = "../../../tests/support/link.rs"]
mod link_support;
#[path = "../../../tests/support/measure.rs"]
mod measure;
#[path = "../../../tests/support/sedna_worker.rs"]
mod sedna_worker;
#[path = "../../../tests/support/service_account.rs"]
mod service_account;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams};

/// The whole bench stops by itself after this.
const WATCHDOG: Duration = Duration::from_secs(90 * 60);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) => value.trim().parse().unwrap_or_else(|_| {
            eprintln!("{name}={value}: not a valid value");
            std::process::exit(2)
        }),
        Err(_) => default,
    }
}

fn main() {
    perennial_tls::install_crypto_provider();
    let Some(kubeconfig) = ["PERENNIAL_BENCH_KUBECONFIG", "PERENNIAL_TEST_KUBECONFIG"]
        .iter()
        .find_map(std::env::var_os)
        .map(PathBuf::from)
    else {
        eprintln!(
            "the fleet bench needs a Kubernetes API server: set PERENNIAL_BENCH_KUBECONFIG to an admin kubeconfig, \
             e.g. after `../shared/k8s/up --state /tmp/k8s-fleet --port 16600 --etcd-port 22600`: \
             PERENNIAL_BENCH_KUBECONFIG=/tmp/k8s-fleet/kubeconfig"
        );
        std::process::exit(2)
    };
    let nodes: usize = env_or("PERENNIAL_BENCH_NODES", 1000);
    if nodes == 0 {
        eprintln!("PERENNIAL_BENCH_NODES=0: a fleet has at least one node");
        std::process::exit(2)
    }
    let only = std::env::var("PERENNIAL_BENCH_ONLY").unwrap_or_default();
    let wants = |phase: &str| only.is_empty() || only.split(',').any(|p| p.trim() == phase);
    // A node is a socket here and one in the operator, which inherits this limit; through the
    // failover phase's Service, two more here. Where the limit cannot be raised that far, the
    // failover phase's replicas share one link port instead (see `Fleet::failover`).
    let needed = nodes + 1000;
    let (soft, hard) = fleet::raise_fd_limit_to((needed + if wants("failover") { 2 * nodes } else { 0 }) as u64);
    let through_service = wants("failover") && soft as usize >= needed + 2 * nodes;
    if (soft as usize) < needed {
        eprintln!(
            "the open-file limit is {soft} (hard {hard}): {nodes} nodes need about {needed} in this process \
             (`ulimit -Hn` higher, run as root, or fewer nodes)"
        );
        std::process::exit(2)
    }
    std::thread::spawn(|| {
        std::thread::sleep(WATCHDOG);
        eprintln!("the fleet bench did not finish within {WATCHDOG:?}: stopping");
        fleet::kill_started();
        std::process::exit(1);
    });
    let idle = Duration::from_secs(env_or("PERENNIAL_BENCH_IDLE_SECS", 60));
    let share: f64 = env_or("PERENNIAL_BENCH_ROUND_SHARE", 1.0);
    let round_phases = match std::env::var("PERENNIAL_BENCH_ROUNDS") {
        Ok(list) => round_phases(&list).unwrap_or_else(|err| {
            eprintln!("PERENNIAL_BENCH_ROUNDS={list}: {err}");
            std::process::exit(2)
        }),
        Err(_) => {
            vec![RoundsPhase { nodes: ((nodes as f64) * share).round() as usize, at_once: usize::MAX, again: false }]
        }
    };
    let churn_secs = Duration::from_secs(env_or("PERENNIAL_BENCH_CHURN_SECS", 60));
    let churn_rate: f64 = env_or("PERENNIAL_BENCH_CHURN_PER_SEC", (nodes as f64 / 100.0).max(1.0));
    let failover_share: f64 = env_or("PERENNIAL_BENCH_FAILOVER_SHARE", 0.1);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(async {
            let cluster = api_server::Cluster::new(kubeconfig).await;
            cluster.install();
            let namespace = cluster.namespace("fleet").await;
            let client = cluster.client.clone();
            let dir = tempfile::tempdir().expect("tempdir");
            let binary = std::env::var_os("PERENNIAL_BENCH_BINARY")
                .map(PathBuf::from)
                .unwrap_or_else(|| env!("CARGO_BIN_EXE_perennial").into());
            println!(
                "perennial fleet bench: {nodes} nodes on one operator, a real kube-apiserver ({}); open files \
                 {soft}; load {}",
                cluster.server,
                measure::load_average()
            );
            let setup = fleet::Setup {
                client: client.clone(),
                server: cluster.server.clone(),
                ca_pem: cluster.ca_pem.clone(),
                binary,
                namespace: namespace.clone(),
                dir: dir.path().to_path_buf(),
                nodes,
                k8s_state: Some(cluster.state.clone()),
                // Straight at the operator unless the failover phase runs (the Service costs this
                // process two more sockets a node).
                through_service,
            };
            let mut fleet = fleet::Fleet::start(setup).await;
            if wants("idle") {
                fleet.idle(idle).await;
            }
            if wants("policy") {
                fleet.policy_change().await;
            }
            if wants("rounds") {
                for RoundsPhase { nodes, at_once, again } in round_phases {
                    fleet.rounds(nodes, at_once, true, again).await;
                }
            }
            if wants("churn") {
                fleet.churn(churn_secs, churn_rate).await;
            }
            if wants("failover") {
                fleet.failover(failover_share).await;
            }
            let problems = fleet.problems().await;
            fleet.stop().await;
            // Deleting the namespace: the API server has no garbage collector without the
            // controller-manager; its objects stay until the state is wiped.
            let _ = Api::<Namespace>::all(client).delete(&namespace, &DeleteParams::default()).await;
            if !problems.is_empty() {
                panic!("the fleet's checks failed:\n{}", problems.join("\n"));
            }
            println!("fleet checks: every node connected, no report lost or doubled, the operator ran throughout");
        })
    }));
    drop(runtime);
    fleet::kill_started();
    if outcome.is_err() {
        std::process::exit(1);
    }
}

/// One rounds phase of `PERENNIAL_BENCH_ROUNDS`.
#[derive(Debug, PartialEq)]
struct RoundsPhase {
    nodes: usize,
    at_once: usize,
    /// Nodes that have played already play another round (which deletes the one before's pods).
    again: bool,
}

/// `PERENNIAL_BENCH_ROUNDS`: rounds phases, each `<nodes>` (at once) or `<nodes>/<at once>` (in
/// waves), `all` for every node not played yet; each phase plays nodes that have not played,
/// or, prefixed `again:`, nodes that have (the first ones) another round.
fn round_phases(list: &str) -> Result<Vec<RoundsPhase>, String> {
    let number = |text: &str| match text.trim() {
        "all" => Ok(usize::MAX),
        text => {
            text.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| format!("{text:?} is not a count of nodes"))
        }
    };
    list.split(',')
        .map(|phase| {
            let (again, phase) = match phase.trim().strip_prefix("again:") {
                Some(rest) => (true, rest),
                None => (false, phase),
            };
            let (nodes, at_once) = match phase.split_once('/') {
                Some((nodes, at_once)) => (number(nodes)?, number(at_once)?),
                None => (number(phase)?, usize::MAX),
            };
            Ok(RoundsPhase { nodes, at_once, again })
        })
        .collect()
}
