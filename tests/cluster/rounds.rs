//! Whole rounds on the real API server: the operator as its ServiceAccount (deploy/operator's
//! RBAC, nothing more), a linked edge agent holding the job by its Dataset's node, three rounds
//! with the pods checked against Sedna's contract, the Dataset's count, the policies in status,
//! a hot swap by `kubectl patch`, then the job and its Dataset deleted.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::Value;

use crate::harness::until;
use crate::stack::{DATASET, JOB, World};

/// What Sedna's GM gives every worker pod (reference/sedna.md §2.3), checked on each pod.
fn check_sedna_contract(pod: &Pod, kind: &str, job_uid: &str, node: &str, namespace: &str) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("lifelonglearningjob.sedna.io/name").map(String::as_str), Some(JOB), "{name}");
    assert_eq!(labels.get("lifelonglearningjob.sedna.io/uid").map(String::as_str), Some(job_uid), "{name}");
    assert_eq!(labels.get("lifelonglearningjob.sedna.io/worker-type").map(String::as_str), Some(kind), "{name}");
    let owner = &pod.metadata.owner_references.as_ref().expect("an owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("LifelongLearningJob", job_uid, Some(true))
    );
    assert!(name.starts_with(&format!("{JOB}-{kind}-")), "{name}");
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(spec.host_network, Some(true), "{name}: Sedna forces hostNetwork");
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"), "{name}");
    assert_eq!(spec.node_name.as_deref(), Some(node), "{name}: the template's node");
    let env: Vec<String> = spec.containers[0].env.iter().flatten().map(|e| e.name.clone()).collect();
    let wanted: &[&str] = match kind {
        "train" => &[
            "NAMESPACE",
            "JOB_NAME",
            "WORKER_NAME",
            "HAS_COMPLETED_INITIAL_TRAINING",
            "LC_SERVER",
            "KB_SERVER",
            "OUTPUT_URL",
            "TRAIN_DATASET_URL",
            "ORIGINAL_DATASET_URL",
            "DATA_PATH_PREFIX",
        ],
        "eval" => &[
            "NAMESPACE",
            "JOB_NAME",
            "WORKER_NAME",
            "LC_SERVER",
            "KB_SERVER",
            "MODEL_URLS",
            "OUTPUT_URL",
            "TEST_DATASET_URL",
            "ORIGINAL_DATASET_URL",
            "DATA_PATH_PREFIX",
        ],
        _ => &["NAMESPACE", "JOB_NAME", "WORKER_NAME", "LC_SERVER", "OUTPUT_URL", "MODEL_URLS"],
    };
    for variable in wanted {
        assert!(env.iter().any(|e| e == variable), "{name}: no {variable} in {env:?}");
    }
    // The template's own env comes first, as Sedna appends its own after it.
    assert_eq!(env[0], "metric_name", "{name}");
    let value = |key: &str| {
        spec.containers[0]
            .env
            .iter()
            .flatten()
            .find(|e| e.name == key)
            .and_then(|e| e.value.clone())
            .unwrap_or_default()
    };
    assert_eq!(value("NAMESPACE"), namespace);
    assert_eq!(value("JOB_NAME"), JOB);
    if kind == "train" {
        assert!(value("TRAIN_DATASET_URL").starts_with("/home/data/"), "{name}: {}", value("TRAIN_DATASET_URL"));
    }
    if kind == "inference" {
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"), "{name}");
    } else {
        assert_eq!(spec.restart_policy.as_deref(), Some("OnFailure"), "{name}");
    }
}

fn policy(job: &Value, kind: &str) -> (String, String, String) {
    let p = &job["status"]["policies"][kind];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (text(&p["plugin"]), text(&p["digest"]), text(&p["health"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_rounds_a_hot_swap_and_a_delete_on_a_real_api_server() {
    let world = World::new("rounds").await;
    let operator = world.start_operator("replica-a");
    let _edge = world.start_edge(operator.link_port);
    let kubelet = world.kubelet();
    // Every status the API server stores, as a watch sees each version (none skipped).
    let stored = stored_phases(&world);
    world.apply_job(40);

    // The job comes down to its Dataset's node, and the edge reports it holds it.
    until("the edge to hold the job", Duration::from_secs(60), || async {
        (world.edge_query(&format!("SELECT COUNT(*) FROM jobs WHERE name = '{}/{JOB}'", world.namespace))? == 1)
            .then_some(())
    })
    .await;

    for round in 1..=3u64 {
        let before = world.samples() as u64;
        world.append_samples(50);
        // The Dataset's count is written before the job's status moves to the round's Train Ready
        // (the edge queues it just before that report), not up to a second later.
        until(&format!("round {round} started"), Duration::from_secs(60), || async {
            (world.job().await?["status"]["round"].as_u64()? >= round).then_some(())
        })
        .await;
        let dataset = serde_json::to_value(world.datasets().get(DATASET).await.expect("the Dataset")).expect("json");
        let count = dataset["status"]["numberOfSamples"].as_u64().unwrap_or(0);
        assert!(
            count >= before + 40,
            "round {round} started (40 new samples at least) with numberOfSamples {count}, {before} before the round"
        );
        let job = world.until_deployed(round, Duration::from_secs(90)).await;
        assert_eq!(job["status"]["roundsCompleted"].as_u64(), Some(round), "{}", job["status"]);
    }
    let job = world.job().await.expect("the job");
    // A round's stage moves are stored in five status changes besides its workers' Running: the
    // train result and the Eval Ready the edge sends right behind it in one, so the job is never
    // stored waiting for the edge's eval step.
    let written = stored.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let one_round = ["Train Starting", "Eval Starting", "Deploy Waiting", "Deploy Starting", "Train Waiting"];
    let rounds_written: Vec<&String> =
        written.iter().filter(|p| p.as_str() != "Train Running" && p.as_str() != "Eval Running").collect();
    assert_eq!(
        rounds_written,
        std::iter::once("Train Waiting").chain(one_round.iter().copied().cycle().take(15)).collect::<Vec<_>>(),
        "the phases stored, in order: {written:?}"
    );
    let uid = job["metadata"]["uid"].as_str().expect("uid").to_owned();
    for kind in ["train", "eval", "inference"] {
        let pods = kubelet.pods(kind);
        if pods.len() != 3 {
            let pods: Vec<String> = pods
                .iter()
                .map(|p| {
                    let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
                    format!("{} {created} {:?}", p.metadata.name.as_deref().unwrap_or(""), p.metadata.annotations)
                })
                .collect();
            panic!(
                "one {kind} pod a round, not {}: {pods:#?}\njob status: {:#}\n{}",
                pods.len(),
                job["status"],
                world.logs()
            );
        }
        for pod in &pods {
            check_sedna_contract(pod, kind, &uid, &world.node, &world.namespace);
        }
    }
    // Finished pods do not pile up: once round 3 is deployed, round 1's Train and Eval pods are
    // deleted (the operator keeps the newest two rounds' by default, for `kubectl logs`).
    until("round 1's train and eval pods deleted, rounds 2 and 3 kept", Duration::from_secs(30), || async {
        let pods = world.pods().list(&Default::default()).await.ok()?;
        let rounds = |kind: &str| {
            let mut rounds: Vec<&str> = pods
                .items
                .iter()
                .filter(|p| {
                    p.labels().get("lifelonglearningjob.sedna.io/worker-type").map(String::as_str) == Some(kind)
                })
                .filter_map(|p| p.labels().get("perennial.io/round").map(String::as_str))
                .collect();
            rounds.sort_unstable();
            rounds
        };
        (rounds("train") == ["2", "3"] && rounds("eval") == ["2", "3"] && rounds("inference") == ["3"]).then_some(())
    })
    .await;
    // In two requests: none in round 1 (no inference pod to replace yet), round 1's inference
    // pod in round 2, and in round 3 round 2's with round 1's train and eval pods, in one.
    let requests = crate::measure::operator_requests(&reqwest::Client::new(), operator.metrics_port).await;
    assert_eq!(requests.get("deletecollection pods").copied(), Some(2.0), "{requests:?}");
    // Sedna's conditions, in order (capped at 16: the last round), each once: no report applied
    // twice.
    let conditions: Vec<String> = job["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .map(|c| format!("{} {}", c["stage"].as_str().unwrap_or(""), c["type"].as_str().unwrap_or("")))
        .collect();
    let one_round = [
        "Train Waiting",
        "Train Ready",
        "Train Starting",
        "Train Running",
        "Train Completed",
        "Eval Waiting",
        "Eval Ready",
        "Eval Starting",
        "Eval Running",
        "Eval Completed",
        "Deploy Waiting",
        "Deploy Ready",
        "Deploy Starting",
        "Deploy Completed",
        "Train Waiting",
    ];
    assert_eq!(conditions[conditions.len() - one_round.len()..], one_round[..], "{conditions:?}");
    // Their data on the newest of each stage and type only: the last round's inputs and results.
    let with_data: Vec<&String> = conditions
        .iter()
        .zip(job["status"]["conditions"].as_array().expect("conditions"))
        .filter(|(_, c)| c.get("data").is_some())
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        with_data,
        ["Train Ready", "Train Completed", "Eval Ready", "Eval Completed", "Deploy Ready"],
        "{}",
        job["status"]["conditions"]
    );

    // The Dataset's count and the edge's policies reach their status.
    until("the Dataset's numberOfSamples", Duration::from_secs(30), || async {
        let dataset = world.datasets().get(DATASET).await.ok()?;
        let count = serde_json::to_value(&dataset).ok()?["status"]["numberOfSamples"].as_u64()?;
        (count == world.samples() as u64).then_some(())
    })
    .await;
    let (plugin, digest, health) = policy(&job, "trigger");
    assert_eq!((plugin.as_str(), health.as_str()), ("builtin:threshold-trigger", "Serving"), "{}", job["status"]);
    assert_eq!(digest.len(), 64, "a sha256 digest: {digest}");

    // An index the edge cannot read: its error reaches the job's status on the API server, with
    // when it began, and leaves it when the index is back.
    let kept = world.index.with_extension("kept");
    std::fs::rename(&world.index, &kept).expect("move the index away");
    std::fs::create_dir(&world.index).expect("a folder in its place");
    until("the edge's fault in the job's status", Duration::from_secs(30), || async {
        let fault = world.job().await?["status"]["fault"].as_str()?.to_owned();
        fault.contains("ingest: ").then_some(()).filter(|_| fault.contains("not a regular file (a folder) (since "))
    })
    .await;
    std::fs::remove_dir(&world.index).expect("the folder");
    std::fs::rename(&kept, &world.index).expect("the index back");
    until("the fault gone from the job's status", Duration::from_secs(30), || async {
        world.job().await?["status"].get("fault").is_none_or(Value::is_null).then_some(())
    })
    .await;

    // A hot swap by `kubectl patch`: the example count-or-age trigger, from its file.
    let path = perennial_policy::builtin::built_plugin_path("count-or-age-trigger").expect("the example plugin");
    // With Sedna's rule beside it as its shadow, counted in status and never acting.
    let shadow = serde_json::json!({"plugin": "builtin:threshold-trigger",
        "config": {"condition": {"operator": ">=", "threshold": 1000, "metric": "num_of_samples"}}});
    let patch = serde_json::json!({"spec": {"trainSpec": {"trigger": {"policy": {
        "plugin": format!("file://{path}"), "config": {"samples": 20, "maxAgeHours": 1}, "shadow": shadow}}}}});
    world.cluster.kubectl_ok(&[
        "patch",
        "ll",
        JOB,
        "-n",
        &world.namespace,
        "--type",
        "merge",
        "-p",
        &patch.to_string(),
    ]);
    let swapped = until("the swapped trigger in status", Duration::from_secs(60), || async {
        let job = world.job().await?;
        let (plugin, digest, health) = policy(&job, "trigger");
        (plugin.contains("count_or_age") && health == "Serving").then_some(digest)
    })
    .await;
    assert_ne!(swapped, digest, "a new digest serves");
    // The new trigger decides the next round: 20 samples (the old one wanted 40).
    world.append_samples(25);
    world.until_deployed(4, Duration::from_secs(90)).await;

    // The shadow waited where the new trigger trained: `kubectl get ll -o yaml` shows its record.
    let yaml = until("the shadow's record in status", Duration::from_secs(60), || async {
        let yaml = world.cluster.kubectl_ok(&["get", "ll", JOB, "-n", &world.namespace, "-o", "yaml"]);
        let job = world.job().await?;
        let shadow = &job["status"]["policies"]["trigger"]["shadow"];
        (shadow["disagreed"].as_u64()? >= 1 && yaml.contains("shadowAnswer: wait")).then_some(yaml)
    })
    .await;
    assert!(yaml.contains("plugin: builtin:threshold-trigger"), "{yaml}");

    // `kubectl get ll` and `describe` show the job as a user sees it.
    let table = world.cluster.kubectl_ok(&["get", "ll", "-n", &world.namespace]);
    let row: Vec<&str> = table.lines().nth(1).expect("a row").split_whitespace().collect();
    assert_eq!(&row[..4], [JOB, "Train", "Waiting", "4"], "{table}");
    assert!(row[4].ends_with("/output/deploy/index.pkl"), "{table}");
    // One Event per round and stage, when its worker is created (events.k8s.io/v1, as 1.24
    // serves them), its own and not folded into a series, published off the reconcile path: the
    // last round's may follow its status. Train's says the trigger's reason, Deploy's the model.
    let deployed = world.job().await.expect("the job")["status"]["deployed"]["url"].as_str().unwrap_or("").to_owned();
    let described = until("the rounds' events in `kubectl describe`", Duration::from_secs(30), || async {
        let described = world.cluster.kubectl_ok(&["describe", "ll", JOB, "-n", &world.namespace]);
        described.contains("round 4: deploying").then_some(described)
    })
    .await;
    for round in 1..=4 {
        let trigger = if round < 4 { "num_of_samples" } else { "" };
        for said in [
            format!("round {round}: triggered ({trigger}"),
            format!("round {round}: evaluating /"),
            format!("round {round}: deploying {deployed}"),
        ] {
            assert_eq!(described.matches(&said).count(), 1, "{said:?} once in:\n{described}");
        }
    }
    let events = world.cluster.kubectl_ok(&["get", "events.events.k8s.io", "-n", &world.namespace, "-o", "json"]);
    let events: Value = serde_json::from_str(&events).expect("events as JSON");
    let mut per_stage = std::collections::BTreeMap::<String, usize>::new();
    for event in events["items"].as_array().expect("items") {
        if event["regarding"]["name"] == JOB && event["type"] == "Normal" {
            assert!(event.get("series").is_none_or(Value::is_null), "not a series: {event}");
            *per_stage.entry(event["action"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
        }
    }
    for round in 1..=4 {
        for stage in ["Train", "Eval", "Deploy"] {
            let action = format!("Round{round}{stage}");
            assert_eq!(per_stage.get(&action), Some(&1), "one Event for {action}: {per_stage:?}");
        }
    }

    // Deleting the job: its finalizer removes its pods, the edge forgets it. The job stays while
    // its pods are still terminating (their containers slow to stop), and goes once they are gone.
    kubelet.slow_to_stop.store(true, Ordering::SeqCst);
    world.cluster.kubectl_ok(&["delete", "ll", JOB, "-n", &world.namespace, "--wait=false"]);
    until("the job's pods terminating", Duration::from_secs(30), || async {
        let pods = world.pods().list(&Default::default()).await.ok()?;
        (!pods.items.is_empty() && pods.items.iter().all(|pod| pod.metadata.deletion_timestamp.is_some())).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = world.job().await.expect("the job is kept while its pods terminate");
    assert!(held["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty()), "{}", held["metadata"]);
    kubelet.slow_to_stop.store(false, Ordering::SeqCst);
    until("the job gone (its finalizer done)", Duration::from_secs(60), || async {
        world.job().await.is_none().then_some(())
    })
    .await;
    until("its pods gone", Duration::from_secs(30), || async {
        let pods = world.pods().list(&Default::default()).await.ok()?;
        pods.items.is_empty().then_some(())
    })
    .await;
    until("the edge to forget the job", Duration::from_secs(30), || async {
        (world.edge_query(&format!("SELECT COUNT(*) FROM jobs WHERE name = '{}/{JOB}'", world.namespace))? == 0)
            .then_some(())
    })
    .await;
    world.cluster.kubectl_ok(&["delete", "dataset", DATASET, "-n", &world.namespace]);
    assert!(world.datasets().get_opt(DATASET).await.expect("get").is_none());

    let forbidden = World::forbidden_calls(&[&operator]);
    assert!(forbidden.is_empty(), "the operator made calls its RBAC does not allow: {forbidden:#?}");
}

/// The job's (stage, phase) as each stored version of it has it, from a watch started before
/// the job exists; a version that changed neither is not listed.
fn stored_phases(world: &World) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (jobs, into) = (world.jobs(), seen.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={JOB}"));
    tokio::spawn(async move {
        let mut events = watcher(jobs, config).boxed();
        while let Some(event) = events.next().await {
            let Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) = event else { continue };
            let Some(status) = job.status else { continue };
            let (Some(stage), Some(phase)) = (status.stage, status.phase) else { continue };
            let now = format!("{stage} {phase}");
            let mut seen = into.lock().unwrap_or_else(|p| p.into_inner());
            if seen.last() != Some(&now) {
                seen.push(now);
            }
        }
    });
    seen
}
