//! Two operator replicas on the real API server: the leader is killed with SIGKILL in the middle
//! of a round; the standby takes the Lease, the edge reconnects to it through a proxy that plays
//! the Service (it sends each connection to the replica that leads, as the Service's selector of
//! the leader's pod label does; outside a pod, `/leaderz` says which), and the round completes
//! with no report lost or applied twice.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::net::{TcpListener, TcpStream};

use crate::harness::until;
use crate::stack::{Operator, World};

async fn leads(metrics_port: u16) -> bool {
    let url = format!("http://127.0.0.1:{metrics_port}/leaderz");
    matches!(
        reqwest::Client::new().get(url).timeout(Duration::from_secs(1)).send().await,
        Ok(response) if response.status().is_success()
    )
}

/// The Service: each new connection goes to the leading replica's link port.
async fn service(listener: TcpListener, replicas: Vec<(u16, u16)>) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else { continue };
        let replicas = replicas.clone();
        tokio::spawn(async move {
            for (metrics_port, link_port) in replicas {
                if leads(metrics_port).await
                    && let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", link_port)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    return;
                }
            }
        });
    }
}

fn ports(operator: &Operator) -> (u16, u16) {
    (operator.metrics_port, operator.link_port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_mid_round_and_nothing_is_lost_or_doubled() {
    let world = World::new("failover").await;
    let mut leader = world.start_operator("replica-a");
    // Its start shares the machine with the whole suite's: a minute, and its log if that is not enough.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !leads(leader.metrics_port).await {
        assert!(std::time::Instant::now() < deadline, "replica-a never led in 60 s:\n{}", world.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let standby = world.start_operator("replica-b");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let service_port = listener.local_addr().expect("address").port();
    tokio::spawn(service(listener, vec![ports(&leader), ports(&standby)]));
    let _edge = world.start_edge(service_port);
    let kubelet = world.kubelet();
    world.apply_job(40);
    world.append_samples(50);
    world.until_deployed(1, Duration::from_secs(90)).await;
    assert!(!leads(standby.metrics_port).await, "the standby serves nothing while the leader leads");
    // A third replica asked to stop while it waits to lead (a rolling update's old standby, a
    // drained node) stops at once, by its own handler: as a container's PID 1 it gets no default
    // action for SIGTERM, and without one lived on until the kubelet's SIGKILL 30 s later.
    let mut third = world.start_operator("replica-c");
    until("replica-c following the leader", Duration::from_secs(60), || async {
        third.process.log_text().contains("following the leader").then_some(())
    })
    .await;
    let stopped = third.process.stop_within(Duration::from_secs(5)).await;
    assert!(
        stopped.is_some_and(|status| status.success()),
        "replica-c, waiting to lead, did not exit 0 within 5 s of SIGTERM ({stopped:?}: killed by the signal \
         means no handler, which as PID 1 is no stop at all):\n{}",
        third.process.log_text()
    );

    // Round 2 starts; its train worker is running when the leader dies, and reports to the edge
    // while no replica leads (the report waits in the edge's outbox).
    kubelet.held.store(true, Ordering::SeqCst);
    world.append_samples(50);
    until("round 2's train pod", Duration::from_secs(60), || async {
        (kubelet.pods("train").len() == 2).then_some(())
    })
    .await;
    leader.process.kill();
    kubelet.held.store(false, Ordering::SeqCst);

    let job = world.until_deployed(2, Duration::from_secs(120)).await;
    assert_eq!(job["status"]["roundsCompleted"].as_u64(), Some(2), "{}", job["status"]);
    for kind in ["train", "eval", "inference"] {
        assert_eq!(kubelet.pods(kind).len(), 2, "one {kind} pod a round, none made twice by the new leader");
    }
    // Round 2's conditions (the status keeps the newest 16, a round), from its Train Ready on:
    // each result and stage move once, none applied twice across the failover.
    let conditions = job["status"]["conditions"].as_array().expect("conditions");
    let is = |c: &serde_json::Value, stage: &str, kind: &str| c["stage"] == stage && c["type"] == kind;
    let start = conditions.iter().rposition(|c| is(c, "Train", "Ready")).expect("round 2's Train Ready");
    let round = &conditions[start..];
    let count = |stage: &str, kind: &str| round.iter().filter(|c| is(c, stage, kind)).count();
    assert_eq!(
        [
            count("Train", "Completed"),
            count("Eval", "Ready"),
            count("Eval", "Completed"),
            count("Deploy", "Ready"),
            count("Deploy", "Completed")
        ],
        [1; 5],
        "{conditions:?}"
    );
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), "perennial-system");
    let lease = leases.get(&format!("operator-{}", world.namespace)).await.expect("the lease");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some("replica-b"));
    assert!(leads(standby.metrics_port).await, "the new leader serves: the Service sends nodes to it");
    let forbidden = World::forbidden_calls(&[&leader, &standby]);
    assert!(forbidden.is_empty(), "the operators made calls their RBAC does not allow: {forbidden:#?}");
}
