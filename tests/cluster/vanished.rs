//! A worker pod deleted while it runs (a user's `kubectl delete`, a node drained): the operator
//! makes it again once, counts it on the job, and the round goes on with the new worker. Only
//! once: the operator asks the API server before it takes a pod its watch lacks for gone.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};

use crate::harness::{free_port, until};
use crate::sedna_worker;
use crate::stack::World;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_worker_is_made_again_once_and_counted() {
    let world = World::new("vanished").await;
    let (metrics_port, link_port) = (free_port(), free_port());
    let _operator = world.start_operator_at("replica-a", metrics_port, link_port);
    let _edge = world.start_edge(link_port);
    let kubelet = world.kubelet();
    kubelet.manual_train.store(true, Ordering::SeqCst);
    world.apply_job(40);
    world.append_samples(50);
    let first =
        until("round 1's train pod", Duration::from_secs(60), || async { kubelet.pods("train").first().cloned() })
            .await;
    let pods = world.pods();
    let first_name = first.metadata.name.clone().unwrap_or_default();
    let _ = pods.patch_status(&first_name, &PatchParams::default(), &Patch::Merge(&sedna_worker::running())).await;
    until("the job Running in Train", Duration::from_secs(30), || async {
        let job = world.job().await?;
        (job["status"]["stage"] == "Train" && job["status"]["phase"] == "Running").then_some(())
    })
    .await;

    pods.delete(&first_name, &DeleteParams::default()).await.expect("the train pod deleted");
    let again =
        until("the train pod made again", Duration::from_secs(60), || async { kubelet.pods("train").get(1).cloned() })
            .await;
    let job = world.job().await.expect("the job");
    assert_eq!(job["status"]["worker"]["recreations"], 1, "counted on the job: {}", job["status"]);
    assert_eq!(job["status"]["round"], 1, "the same round");

    // The new worker runs and reports, as Sedna's library does: the round completes with it.
    let name = again.metadata.name.clone().unwrap_or_default();
    let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::running())).await;
    let env = sedna_worker::env_of(&again);
    let url = format!("{}/sedna/workers/{}/info", env["LC_SERVER"], env["WORKER_NAME"]);
    let body = sedna_worker::report(&again, &world.namespace, "train");
    let reply = reqwest::Client::new()
        .post(&url)
        .json(&body)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("the edge answers");
    assert_eq!(reply.status().as_u16(), 200, "{}", reply.text().await.unwrap_or_default());
    let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::succeeded())).await;
    world.until_deployed(1, Duration::from_secs(90)).await;

    let names = |kind: &str| -> Vec<String> {
        kubelet.pods(kind).iter().map(|pod| pod.metadata.name.clone().unwrap_or_default()).collect()
    };
    assert_eq!(names("train"), [first_name, name], "made again once, never twice");
    assert_eq!(names("eval").len(), 1, "{:?}", names("eval"));
    let job = world.job().await.expect("the job");
    assert_eq!(job["status"]["roundsCompleted"], 1, "{}", job["status"]);
}
