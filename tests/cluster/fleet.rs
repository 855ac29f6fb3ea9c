//! A fleet on one operator (issue #36), small enough for CI: 200 simulated nodes (the edge's own
//! link client over an in-memory state, `tests/support/fleet.rs`, as the fleet bench runs them)
//! connect to a real operator, idle on heartbeats, each report Train Ready (the operator creates
//! every train pod), then drop and reconnect with reports in flight, then lose their leader (a
//! SIGKILL; a standby takes over). Fails if a node never connects, a report is lost or doubled,
//! or the operator exits.

use std::time::{Duration, Instant};

use crate::fleet_sim::{Fleet, Setup, raise_fd_limit};
use crate::harness::cluster;

const NODES: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_200_nodes_connects_idles_starts_rounds_and_survives_churn_and_failover() {
    let cluster = cluster();
    cluster.install();
    let client = cluster.client().await;
    let namespace = cluster.namespace(&client, "fleet").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (soft, _) = raise_fd_limit();
    assert!(soft as usize > 2 * NODES + 500, "the open-file limit ({soft}) is too low for {NODES} nodes");
    let started = Instant::now();
    let setup = Setup {
        client,
        server: cluster.server.clone(),
        ca_pem: cluster.ca_pem.clone(),
        binary: env!("CARGO_BIN_EXE_perennial").into(),
        namespace,
        dir: dir.path().to_path_buf(),
        nodes: NODES,
        k8s_state: None,
        through_service: true,
    };
    let mut fleet = Fleet::start(setup).await;
    let idle = fleet.idle(Duration::from_secs(10)).await;
    assert_eq!(idle.connected, NODES, "every node stays connected while idle");
    fleet.rounds(usize::MAX, usize::MAX, false, false).await;
    fleet.churn(Duration::from_secs(10), 10.0).await;
    // The leader SIGKILLed with every job mid-round (train pods Pending) and a report queued on
    // every node: the standby takes over, every node resyncs, nothing lost or doubled.
    let failover = fleet.failover(0.0).await;
    assert_eq!(failover.connected, NODES, "every node reconnected to the new leader");
    let problems = fleet.problems().await;
    let log = fleet.operator.tail();
    fleet.stop().await;
    assert!(problems.is_empty(), "{}\n{log}", problems.join("\n"));
    eprintln!("the fleet test took {:.1} s", started.elapsed().as_secs_f64());
}
