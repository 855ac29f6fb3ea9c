//! The operator restarted while a worker reports (issue #35's first repro). A linked edge learns
//! a worker's name from the operator's desired state; a restarted operator creates the pending
//! train pod at once, and the pod's worker may report before the link is back. Sedna's workers
//! report once and do not retry: the report must be held by the edge and taken when the name
//! arrives, never refused and lost, never applied twice. Twenty rounds, the operator SIGKILLed
//! and started again at each round's Train Ready, the report posted once at a random moment.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::api::{Patch, PatchParams};

use crate::harness::{free_port, until};
use crate::sedna_worker;
use crate::stack::World;

const ROUNDS: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_posted_while_the_operator_restarts_are_never_lost_or_applied_twice() {
    let world = World::new("restart").await;
    let (metrics_port, link_port) = (free_port(), free_port());
    let mut operator = world.start_operator_at("replica-a", metrics_port, link_port);
    let _edge = world.start_edge(link_port);
    let kubelet = world.kubelet();
    kubelet.manual_train.store(true, Ordering::SeqCst);
    world.apply_job(40);
    let mut moments = crate::moments::Moments::new("operator restarts");
    let http = reqwest::Client::new();
    let mut replies = Vec::new();
    for round in 1..=ROUNDS {
        world.append_samples(50);
        // At Train Ready of this round: SIGKILL, and the same replica started again at once.
        until(&format!("round {round}'s Train Ready"), Duration::from_secs(60), || async {
            let job = world.job().await?;
            let status = &job["status"];
            (status["round"].as_u64() == Some(round) && status["stage"] == "Train").then_some(())
        })
        .await;
        operator.process.kill();
        operator = world.start_operator_at("replica-a", metrics_port, link_port);
        // The round's train pod, made by the killed replica or the restarted one.
        let pod = until(&format!("round {round}'s train pod"), Duration::from_secs(60), || async {
            kubelet.pods("train").get(round as usize - 1).cloned()
        })
        .await;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let pods = world.pods();
        let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::running())).await;
        // At once half of the time (the link is not back yet: the edge has not heard of the
        // worker), else at a random moment of the next 1.5 s.
        let delay = if moments.below(2) == 0 { 0 } else { moments.below(1500) };
        tokio::time::sleep(Duration::from_millis(delay)).await;
        // Once, as Sedna's library does.
        let env = sedna_worker::env_of(&pod);
        let url = format!("{}/sedna/workers/{}/info", env["LC_SERVER"], env["WORKER_NAME"]);
        let body = sedna_worker::report(&pod, &world.namespace, "train");
        let reply =
            http.post(&url).json(&body).timeout(Duration::from_secs(10)).send().await.expect("the edge answers");
        let status = reply.status().as_u16();
        let text = reply.text().await.unwrap_or_default();
        assert_eq!(status, 200, "round {round}: the report was refused: {text}\n{}", world.logs());
        replies.push(text);
        let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&sedna_worker::succeeded())).await;
        world.until_deployed(round, Duration::from_secs(90)).await;
    }
    let job = world.job().await.expect("the job");
    assert_eq!(job["status"]["roundsCompleted"].as_u64(), Some(ROUNDS), "{}", job["status"]);
    for kind in ["train", "eval"] {
        let pods = kubelet.pods(kind);
        let made: Vec<String> = pods
            .iter()
            .map(|pod| {
                let round = pod.metadata.labels.as_ref().and_then(|l| l.get("perennial.io/round")).cloned();
                let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string());
                format!("{} round {round:?} created {created:?}", pod.metadata.name.as_deref().unwrap_or(""))
            })
            .collect();
        assert_eq!(
            pods.len() as u64,
            ROUNDS,
            "one {kind} pod a round, none made twice: {made:#?}\njob status: {:#}\n{}",
            job["status"],
            world.logs()
        );
    }
    // Each round's train result taken once: the edge relayed one report per train worker.
    let relayed = world.edge_query("SELECT count(*) FROM workers WHERE stage = 'train' AND last_report IS NOT NULL");
    assert_eq!(relayed, Some(ROUNDS as i64));
    let held = replies.iter().filter(|reply| reply.contains("held")).count();
    eprintln!("{held} of {ROUNDS} reports reached the edge before their worker's name and were held");
}
