//! A job whose edge node never connected does not wait without a word: once the node has held it
//! with no link past the grace period, the job says so (a Warning Event, `kubectl describe`), once;
//! when the node connects, the job runs.

use std::time::Duration;

use crate::harness::until;
use crate::stack::{JOB, World};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_node_never_connected_says_so_once_and_runs_when_it_does() {
    let world = World::new("absent").await;
    let operator = world.start_operator("absent-a");
    world.apply_job(50);
    let describe = || world.cluster.kubectl_ok(&["describe", "ll", JOB, "-n", &world.namespace]);
    let described = until("the job's word that its node has not connected", Duration::from_secs(90), || async {
        let described = describe();
        described.contains("NodeNotConnected").then_some(described)
    })
    .await;
    let said = format!("edge node {} has not connected to this operator's link", world.node);
    assert!(described.contains(&said), "{said:?} in:\n{described}");

    // The node connects: the job runs, and nothing more is said of its absence.
    let _edge = world.start_edge(operator.link_port);
    let _kubelet = world.kubelet();
    world.append_samples(100);
    world.until_deployed(1, Duration::from_secs(90)).await;
    let described = describe();
    assert_eq!(described.matches("NodeNotConnected").count(), 1, "said once:\n{described}");
}
