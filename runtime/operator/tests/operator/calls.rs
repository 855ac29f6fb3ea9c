//! The operator against a mock API server (tower-test, as kube-rs's controller-rs does): each
//! case runs one reconcile and asserts the exact sequence of API calls it makes, their bodies,
//! and what the reconcile returns. The stage machine under it is tested by tables
//! (`lifecycle::tests`); this checks the Kubernetes shell around it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use perennial_api::{Dataset, LifelongLearningJob, Phase, Stage};
use perennial_lifecycle::{self as lifecycle, Settings};
use perennial_operator::events::Events;
use perennial_operator::patch::merge_apply;
use perennial_operator::pod_name::{Start, worker_pod_name};
use perennial_operator::reconcile::{self, FINALIZER, WORKER_NAME_ANNOTATION};
use perennial_operator::running_hold;
use perennial_operator::watches::Stores;
use perennial_operator::worker_pod::WorkerPod;
use perennial_operator::{Context, Inbox, Metrics, WorkerDefaults};
use serde_json::{Value, json};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

const JOBS: &str = "/apis/sedna.io/v1alpha1/namespaces/ml/lifelonglearningjobs";
const PODS: &str = "/api/v1/namespaces/ml/pods";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ml/events";
const UID: &str = "9f1c2d3e-0000-4000-8000-000000000001";

/// One API call as the mock server saw it.
struct Call {
    method: String,
    /// Path and query.
    uri: String,
    body: Value,
    reply: tower_test::mock::SendResponse<Response<Body>>,
}

impl Call {
    fn respond(self, status: StatusCode, body: Value) {
        let bytes = serde_json::to_vec(&body).expect("json");
        self.reply.send_response(Response::builder().status(status).body(Body::from(bytes)).expect("response"));
    }

    fn ok(self, body: Value) {
        self.respond(StatusCode::OK, body)
    }

    fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or_default()
    }

    fn query(&self) -> String {
        let query = self.uri.split_once('?').map(|(_, q)| q).unwrap_or_default();
        percent_decode(query.trim_start_matches('&'))
    }
}

fn percent_decode(text: &str) -> String {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(byte) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct ApiServer {
    handle: Handle,
    /// Events that came while another call was awaited: they are published off the reconcile
    /// path, in the order made but in no fixed order with its other calls. Reason, type, note.
    events: VecDeque<(String, String, String)>,
    /// The operator's watches, as the tests fill them.
    jobs: Writer<LifelongLearningJob>,
    pods: Writer<WorkerPod>,
    datasets: Writer<Dataset>,
    pods_seen: Arc<AtomicU64>,
}

impl ApiServer {
    async fn next_call(&mut self, waiting_for: &str) -> Call {
        let next = tokio::time::timeout(Duration::from_secs(5), self.handle.next_request()).await;
        let (request, reply) = next
            .unwrap_or_else(|_| panic!("expected {waiting_for}, but no call came"))
            .unwrap_or_else(|| panic!("expected {waiting_for}, but the client is gone"));
        let method = request.method().to_string();
        let uri = request.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
        let bytes = request.into_body().collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("a JSON body") };
        Call { method, uri, body, reply }
    }

    /// The next call that is not an event, which must be `method` on `path`.
    async fn expect(&mut self, method: &str, path: &str) -> Call {
        loop {
            let call = self.next_call(&format!("{method} {path}")).await;
            if call.method == "POST" && call.path() == EVENTS {
                self.take_event(call);
                continue;
            }
            assert_eq!(
                (call.method.as_str(), call.path()),
                (method, path),
                "unexpected call {} {}",
                call.method,
                call.uri
            );
            return call;
        }
    }

    /// An event about the job, answered as created.
    fn take_event(&mut self, call: Call) {
        assert_eq!(call.body["regarding"]["name"], "thermal");
        assert_eq!(call.body["regarding"]["kind"], "LifelongLearningJob");
        self.events.push_back((
            call.body["reason"].as_str().unwrap_or_default().to_owned(),
            call.body["type"].as_str().unwrap_or_default().to_owned(),
            call.body["note"].as_str().unwrap_or_default().to_owned(),
        ));
        let body = call.body.clone();
        call.respond(StatusCode::CREATED, body);
    }

    /// The next event about the job: its reason, type and note.
    async fn event(&mut self) -> (String, String, String) {
        if self.events.is_empty() {
            let call = self.next_call("an event").await;
            assert_eq!((call.method.as_str(), call.path()), ("POST", EVENTS), "unexpected call {}", call.uri);
            self.take_event(call);
        }
        self.events.pop_front().expect("an event")
    }

    /// The train pod created (answered as `name`).
    async fn train_pod(&mut self, name: &str) -> Value {
        let create = self.expect("POST", PODS).await;
        let body = create.body.clone();
        create.respond(StatusCode::CREATED, created(body.clone(), name));
        body
    }

    /// The events not taken yet, and the rest of the calls, which must be events only; returns
    /// their reasons.
    async fn only_events(&mut self) -> Vec<String> {
        while let Ok(Some((request, reply))) =
            tokio::time::timeout(Duration::from_millis(300), self.handle.next_request()).await
        {
            let method = request.method().to_string();
            let uri = request.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
            let bytes = request.into_body().collect_bytes().await.expect("body");
            let body: Value = serde_json::from_slice(&bytes).expect("json");
            let call = Call { method, uri, body, reply };
            assert_eq!((call.method.as_str(), call.path()), ("POST", EVENTS), "only events were expected");
            self.take_event(call);
        }
        self.events.drain(..).map(|(reason, _, _)| reason).collect()
    }

    /// What the pod watch holds from now on (listed at resourceVersion 50).
    fn show_pods(&mut self, pods: Vec<Value>) {
        self.pods.apply_watcher_event(&watcher::Event::Init);
        for pod in pods {
            self.pods.apply_watcher_event(&watcher::Event::InitApply(serde_json::from_value(pod).expect("a pod")));
        }
        self.pods.apply_watcher_event(&watcher::Event::InitDone);
        self.pods_seen.store(50, Ordering::Release);
    }

    /// The Dataset watch has not shown the job's Dataset yet.
    fn forget_datasets(&mut self) {
        self.datasets.apply_watcher_event(&watcher::Event::Init);
        self.datasets.apply_watcher_event(&watcher::Event::InitDone);
    }
}

fn setup() -> (ApiServer, Arc<Context>, Arc<Inbox>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let (inbox, _woken) = Inbox::new();
    let inbox = Arc::new(inbox);
    let reporter = Reporter { controller: "perennial-operator".into(), instance: Some("test".into()) };
    let (jobs, jobs_writer) = reflector::store::<LifelongLearningJob>();
    let (pods, pods_writer) = reflector::store::<WorkerPod>();
    let (datasets, datasets_writer) = reflector::store::<Dataset>();
    let pods_seen = Arc::new(AtomicU64::new(0));
    let metrics = Arc::new(Metrics::default());
    let context = Context {
        client: client.clone(),
        settings: Settings::default(),
        workers: WorkerDefaults {
            lc_server: "http://localhost:9100".into(),
            kb_server: "http://localhost:9020".into(),
            fetch_image: "perennial:test".into(),
        },
        inbox: inbox.clone(),
        stores: Stores { jobs, datasets, pods, pods_seen: pods_seen.clone() },
        events: Events::start(client, reporter, metrics.clone()),
        metrics,
        failures: Default::default(),
        written: Default::default(),
        written_jobs: Default::default(),
        finished_rounds_kept: 2,
        delete_by_name_past: reconcile::DELETE_BY_NAME_PAST_PODS,
        pull_secrets: Default::default(),
        running_holds: Default::default(),
    };
    let mut api = ApiServer {
        handle,
        events: VecDeque::new(),
        jobs: jobs_writer,
        pods: pods_writer,
        datasets: datasets_writer,
        pods_seen,
    };
    api.show_pods(vec![]);
    let dataset = serde_json::from_value(dataset_json()).expect("a dataset");
    api.datasets.apply_watcher_event(&watcher::Event::Init);
    api.datasets.apply_watcher_event(&watcher::Event::InitApply(dataset));
    api.datasets.apply_watcher_event(&watcher::Event::InitDone);
    (api, Arc::new(context), inbox)
}

fn job_json(status: Value) -> Value {
    let template = |name: &str| json!({"spec": {"containers": [{"name": name, "image": format!("sedna/{name}:v1")}]}});
    json!({
        "apiVersion": "sedna.io/v1alpha1",
        "kind": "LifelongLearningJob",
        "metadata": {
            "name": "thermal", "namespace": "ml", "uid": UID, "resourceVersion": "10",
            "finalizers": [FINALIZER]
        },
        "spec": {
            "dataset": {"name": "thermal-data", "trainProb": 0.8},
            "trainSpec": {
                "template": template("train"),
                "trigger": {"checkPeriodSeconds": 60, "timer": {"start": "00:00", "end": "24:00"},
                            "condition": {"operator": ">", "threshold": 100, "metric": "num_of_samples"}}
            },
            "evalSpec": {"template": template("eval")},
            "deploySpec": {"model": {"hotUpdateEnabled": true, "pollPeriodSeconds": 60},
                           "trigger": {"condition": {"operator": ">", "threshold": 0.1, "metric": "precision_delta"}},
                           "template": template("inference")},
            "outputDir": "/output/thermal"
        },
        "status": status
    })
}

/// The job as the operator's job watch stores it: its pod templates compact.
fn job(status: Value) -> Arc<LifelongLearningJob> {
    let mut job = serde_json::from_value(job_json(status)).expect("a job");
    perennial_operator::stored_templates::compact(&mut job);
    Arc::new(job)
}

fn dataset_json() -> Value {
    json!({
        "apiVersion": "sedna.io/v1alpha1", "kind": "Dataset",
        "metadata": {"name": "thermal-data", "namespace": "ml", "uid": "d-1"},
        "spec": {"url": "/data/thermal/index.txt", "format": "txt", "nodeName": "edge-1"}
    })
}

fn conflict() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
           "message": "the object has been modified; please apply your changes to the latest version"})
}

fn pod_list(pods: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "50"}, "items": pods})
}

fn pod(kind: &str, round: u64, name: &str, status: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": "2026-12-01T00:00:00Z", "labels": {
            "lifelonglearningjob.sedna.io/uid": UID,
            "lifelonglearningjob.sedna.io/worker-type": kind,
            "perennial.io/round": round.to_string()
        }},
        "spec": {"containers": [{"name": kind, "image": "i"}], "nodeName": "edge-1"},
        "status": status
    })
}

/// The status a job has after the stage machine has walked it from the start through `reports`.
fn status_after(reports: &[lifecycle::Report]) -> Value {
    let view = lifecycle::JobView { uid: UID.into(), timeouts: [None; 3] };
    let observed = lifecycle::Observations { reports: reports.to_vec(), worker: None };
    let step = lifecycle::step(&view, &Default::default(), &observed, Timestamp::now(), &Settings::default());
    serde_json::to_value(step.status).expect("json")
}

fn report(round: u64, stage: Stage, status: Phase, data: Value) -> lifecycle::Report {
    lifecycle::Report {
        job_uid: UID.into(),
        round,
        stage: Some(stage),
        status: Some(status),
        data: serde_json::from_value(data).expect("condition data"),
        reason: None,
        next_follows: false,
    }
}

fn train_ready() -> lifecycle::Report {
    report(
        1,
        Stage::Train,
        Phase::Ready,
        json!({"input": {"dataURL": "/output/thermal/data/train/1/data.txt", "outputDir": "/output/thermal/train/1"}}),
    )
}

fn env_of(pod: &Value) -> Vec<(String, String)> {
    pod["spec"]["containers"][0]["env"]
        .as_array()
        .map(|env| {
            env.iter()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap_or_default().to_owned(),
                        e["value"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The start of a `kind` worker of `round` after `retries` failures.
fn start(kind: &'static str, round: u64, retries: u32) -> Start<'static> {
    Start { job_uid: UID, kind, round, retries }
}

fn created(mut pod: Value, name: &str) -> Value {
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["uid"] = json!(format!("uid-{name}"));
    pod["metadata"]["resourceVersion"] = json!("40");
    pod
}

#[tokio::test]
async fn a_new_job_gets_the_finalizer_and_its_status_initialised_in_one_turn() {
    let (mut api, ctx, _inbox) = setup();
    let mut fresh = job_json(Value::Null);
    fresh["metadata"]["finalizers"] = Value::Null;
    let fresh: Arc<LifelongLearningJob> = Arc::new(serde_json::from_value(fresh.clone()).expect("job"));
    let run = tokio::spawn(reconcile::reconcile(fresh, ctx.clone()));
    // A server-side apply of the finalizer alone, under its own field manager: the same answer
    // whatever the cached copy showed (a stale one is no 422 and no retry).
    let call = api.expect("PATCH", &format!("{JOBS}/thermal")).await;
    assert!(call.uri.contains("fieldManager=perennial-operator-finalizer"), "{}", call.uri);
    assert_eq!(
        call.body,
        json!({"apiVersion": "sedna.io/v1alpha1", "kind": "LifelongLearningJob",
               "metadata": {"name": "thermal", "finalizers": [FINALIZER]}})
    );
    call.ok(job_json(Value::Null));

    // The job the apply returned is applied at once: its status initialised, in the same turn.
    // Its pods come from the pod watch: no call.
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(patch.body["metadata"]["resourceVersion"], "10");
    let status = patch.body["status"].clone();
    assert_eq!((status["stage"].as_str(), status["phase"].as_str()), (Some("Train"), Some("Waiting")));
    assert_eq!(status["conditions"][0]["type"], "Waiting");
    assert_eq!(status["conditions"][0]["stage"], "Train");
    patch.ok(job_json(status));
    let (reason, kind, note) = api.event().await;
    assert_eq!((reason.as_str(), kind.as_str(), note.as_str()), ("TrainWaiting", "Normal", "waiting for the trigger"));
    let requeue = run.await.expect("join").expect("reconciled");
    assert_eq!(requeue, kube::runtime::controller::Action::requeue(Duration::from_secs(300)));
    assert!(api.only_events().await.is_empty());
}

#[tokio::test]
async fn train_ready_creates_the_train_pod_after_the_status_and_acknowledges_the_report() {
    let (mut api, ctx, inbox) = setup();
    let waiting = status_after(&[]);
    let receipt = inbox.deliver("ml", "thermal", train_ready());
    let run = tokio::spawn(reconcile::reconcile(job(waiting.clone()), ctx.clone()));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let status = patch.body["status"].clone();
    assert_eq!((status["phase"].as_str(), status["round"].as_u64()), (Some("Starting"), Some(1)));
    let types: Vec<&str> =
        status["conditions"].as_array().expect("conditions").iter().filter_map(|c| c["type"].as_str()).collect();
    assert_eq!(types, ["Waiting", "Ready", "Starting"], "the whole list, under the version read");
    patch.ok(job_json(status));
    // The pod, from the dataset's facts (the Dataset watch's: no call).
    let create = api.expect("POST", PODS).await;
    let pod = create.body.clone();
    // Named by which start it is (round 1's first Train): a second create of it would find it.
    assert_eq!(pod["metadata"]["name"], worker_pod_name("thermal", &start("train", 1, 0)));
    assert_eq!(pod["metadata"]["generateName"], Value::Null);
    assert_eq!(pod["metadata"]["labels"]["lifelonglearningjob.sedna.io/worker-type"], "train");
    assert_eq!(pod["metadata"]["labels"]["perennial.io/round"], "1");
    assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], UID);
    // From the template the job store holds compact.
    assert_eq!(pod["spec"]["containers"][0]["image"], "sedna/train:v1");
    assert!(pod["metadata"]["annotations"].get("operator.perennial.io/stored-templates").is_none());
    let env = env_of(&pod);
    let worker = env.iter().find(|(k, _)| k == "WORKER_NAME").map(|(_, v)| v.clone()).expect("WORKER_NAME");
    assert!(worker.starts_with("train-worker-") && worker.len() == "train-worker-".len() + 24, "{worker}");
    assert_eq!(pod["metadata"]["annotations"][WORKER_NAME_ANNOTATION], worker.as_str());
    assert!(env.contains(&("TRAIN_DATASET_URL".into(), "/home/data/output/thermal/data/train/1/data.txt".into())));
    create.respond(StatusCode::CREATED, created(pod, "thermal-train-x7k2p"));
    // One Event for the round's Train: its pod, and no more.
    let (reason, _, note) = api.event().await;
    assert_eq!(reason, "TrainStarted");
    assert!(
        note.starts_with("round 1: triggered") && note.ends_with("created the train pod thermal-train-x7k2p"),
        "{note}"
    );
    run.await.expect("join").expect("reconciled");
    // Written: the report is acknowledged and leaves the inbox.
    tokio::time::timeout(Duration::from_secs(1), receipt).await.expect("acknowledged").expect("applied");
    assert!(inbox.peek("ml", "thermal").is_empty());
    assert!(ctx.metrics.render().contains("perennial_operator_pods_created_total{worker=\"train\"} 1"));
}

#[tokio::test]
async fn a_succeeded_train_pod_and_its_result_move_the_job_to_eval() {
    let (mut api, ctx, inbox) = setup();
    let mut running = status_after(&[train_ready()]);
    running["phase"] = json!("Running");
    let model = json!({"format": "pkl", "url": "/output/thermal/train/1/model.pkl"});
    let completed = report(1, Stage::Train, Phase::Completed, json!({"output": {"models": [model]}}));
    let receipt = inbox.deliver("ml", "thermal", completed);
    let done = json!({"phase": "Succeeded", "containerStatuses": [{"name": "train", "image": "i", "imageID": "",
        "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-12-01T00:01:00Z"}}}]});
    api.show_pods(vec![pod("train", 1, "thermal-train-x7k2p", done)]);
    let run = tokio::spawn(reconcile::reconcile(job(running.clone()), ctx));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let status = patch.body["status"].clone();
    assert_eq!((status["stage"].as_str(), status["phase"].as_str()), (Some("Eval"), Some("Waiting")));
    assert_eq!(status["lastTrained"]["url"], "/output/thermal/train/1/model.pkl");
    patch.ok(job_json(status));
    assert!(api.only_events().await.is_empty(), "Eval's start is said with its pod");
    run.await.expect("join").expect("reconciled");
    receipt.await.expect("applied");
}

#[tokio::test]
async fn a_workers_running_waits_a_moment_and_goes_in_one_write_with_its_result() {
    let (mut api, ctx, inbox) = setup();
    let starting = status_after(&[train_ready()]);
    assert_eq!(starting["phase"], "Starting");
    api.show_pods(vec![pod("train", 1, "thermal-train-x7k2p", json!({"phase": "Running"}))]);
    // Running alone: no write yet, looked at again within the hold (not at the 5-minute resync).
    let requeue = tokio::spawn(reconcile::reconcile(job(starting.clone()), ctx.clone()));
    assert!(api.only_events().await.is_empty(), "no call for a Running alone");
    let requeue = requeue.await.expect("join").expect("reconciled");
    assert!(requeue != kube::runtime::controller::Action::requeue(Duration::from_secs(300)), "{requeue:?}");
    assert!(requeue != kube::runtime::controller::Action::await_change(), "looked at again: {requeue:?}");
    assert_eq!(ctx.running_holds.len(), 1);
    // The result comes within the hold: one write takes the Running and the result.
    let model = json!({"format": "pkl", "url": "/output/thermal/train/1/model.pkl"});
    let receipt = inbox.deliver(
        "ml",
        "thermal",
        report(1, Stage::Train, Phase::Completed, json!({"output": {"models": [model]}})),
    );
    let run = tokio::spawn(reconcile::reconcile(job(starting.clone()), ctx.clone()));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let mut status = starting.clone();
    merge_apply(&mut status, &patch.body["status"]);
    assert_eq!((status["stage"].as_str(), status["phase"].as_str()), (Some("Eval"), Some("Waiting")));
    let train: Vec<&str> = status["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .filter(|c| c["stage"] == "Train")
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert!(train.ends_with(&["Running", "Completed"]), "the Running goes with its result: {train:?}");
    patch.ok(job_json(status));
    run.await.expect("join").expect("reconciled");
    receipt.await.expect("applied");
    assert!(ctx.running_holds.is_empty(), "nothing waits once written");
    // A worker that runs on: its Running is written once the hold is over.
    let (mut api, ctx, _inbox) = setup();
    api.show_pods(vec![pod("train", 1, "thermal-train-x7k2p", json!({"phase": "Running"}))]);
    let held = tokio::spawn(reconcile::reconcile(job(starting.clone()), ctx.clone()));
    assert!(api.only_events().await.is_empty());
    held.await.expect("join").expect("reconciled");
    tokio::time::sleep(running_hold::RUNNING_WRITE_HOLD).await;
    let run = tokio::spawn(reconcile::reconcile(job(starting.clone()), ctx));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(patch.body["status"]["phase"], "Running");
    let mut status = starting;
    merge_apply(&mut status, &patch.body["status"]);
    patch.ok(job_json(status));
    run.await.expect("join").expect("reconciled");
}

#[tokio::test]
async fn a_train_result_the_edge_follows_with_eval_ready_is_written_once_with_it() {
    let (mut api, ctx, inbox) = setup();
    let mut running = status_after(&[train_ready()]);
    running["phase"] = json!("Running");
    let model = json!({"format": "pkl", "url": "/output/thermal/train/1/model.pkl"});
    let completed = lifecycle::Report {
        next_follows: true,
        ..report(1, Stage::Train, Phase::Completed, json!({"output": {"models": [model.clone()]}}))
    };
    let mut result = inbox.deliver("ml", "thermal", completed);
    api.show_pods(vec![pod("train", 1, "thermal-train-x7k2p", json!({"phase": "Running"}))]);
    // The result alone: no write, not acknowledged, looked at again within the wait.
    let requeue = tokio::spawn(reconcile::reconcile(job(running.clone()), ctx.clone()));
    assert!(api.only_events().await.is_empty(), "no call while the edge's Eval Ready is on its way");
    let requeue = requeue.await.expect("join").expect("reconciled");
    assert!(requeue != kube::runtime::controller::Action::requeue(Duration::from_secs(300)), "{requeue:?}");
    assert!(result.try_recv().is_err(), "not acknowledged before it is written");
    // The Eval Ready comes: one write takes both, and the eval pod is created.
    let input = json!({"input": {"models": [model], "dataURL": "/output/thermal/data/eval/1/data.txt"}});
    let ready = inbox.deliver("ml", "thermal", report(1, Stage::Eval, Phase::Ready, input));
    let run = tokio::spawn(reconcile::reconcile(job(running.clone()), ctx));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let mut status = running;
    merge_apply(&mut status, &patch.body["status"]);
    assert_eq!((status["stage"].as_str(), status["phase"].as_str()), (Some("Eval"), Some("Starting")));
    assert_eq!(status["lastTrained"]["url"], "/output/thermal/train/1/model.pkl");
    patch.ok(job_json(status));
    let create = api.expect("POST", PODS).await;
    assert_eq!(create.body["metadata"]["name"], worker_pod_name("thermal", &start("eval", 1, 0)));
    let body = create.body.clone();
    create.respond(StatusCode::CREATED, created(body, "thermal-eval-1"));
    assert_eq!(api.only_events().await, ["EvalStarted"]);
    run.await.expect("join").expect("reconciled");
    result.await.expect("the result applied");
    ready.await.expect("the Ready applied");
}

#[tokio::test]
async fn a_first_deploy_with_no_inference_pod_to_replace_asks_no_delete() {
    let (mut api, ctx, inbox) = setup();
    let model = json!({"format": "pkl", "url": "/output/thermal/deploy/index.pkl"});
    let mut status = status_after(&[train_ready()]);
    status["stage"] = json!("Deploy");
    status["phase"] = json!("Waiting");
    status["worker"] = Value::Null;
    inbox.deliver("ml", "thermal", report(1, Stage::Deploy, Phase::Ready, json!({"input": {"models": [model]}})));
    // Round 1's finished train and eval pods, no inference pod (one being deleted does not count).
    let done = json!({"phase": "Succeeded"});
    let mut going = pod("inference", 0, "thermal-inference-going", json!({"phase": "Running"}));
    going["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    api.show_pods(vec![
        pod("train", 1, "thermal-train-1", done.clone()),
        pod("eval", 1, "thermal-eval-1", done),
        going,
    ]);
    let run = tokio::spawn(reconcile::reconcile(job(status.clone()), ctx));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let mut starting = status;
    merge_apply(&mut starting, &patch.body["status"]);
    patch.ok(job_json(starting));
    // Straight to the new pod: no deletecollection that would find nothing.
    let create = api.expect("POST", PODS).await;
    assert!(create.body["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("thermal-inference-")));
    let body = create.body.clone();
    create.respond(StatusCode::CREATED, created(body, "thermal-inference-1"));
    assert_eq!(api.only_events().await, ["DeployStarted"]);
    run.await.expect("join").expect("reconciled");
}

#[tokio::test]
async fn deploy_rolls_the_inference_pod_and_completes_when_the_new_one_is_ready() {
    let (mut api, ctx, inbox) = setup();
    // Round 1 evaluated; the edge chose its model and reports Deploy Ready.
    let model = json!({"format": "pkl", "url": "/output/thermal/deploy/index.pkl", "metrics": {"accuracy": 0.9}});
    let mut status = status_after(&[train_ready()]);
    status["stage"] = json!("Deploy");
    status["phase"] = json!("Waiting");
    status["worker"] = Value::Null;
    status["deployed"] = json!({"round": 0, "url": "/output/thermal/deploy/index.pkl", "format": "pkl"});
    let ready = report(1, Stage::Deploy, Phase::Ready, json!({"input": {"models": [model]}}));
    inbox.deliver("ml", "thermal", ready);
    let old = pod("inference", 0, "thermal-inference-old", json!({"phase": "Running"}));
    api.show_pods(vec![old]);
    let run = tokio::spawn(reconcile::reconcile(job(status.clone()), ctx.clone()));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let mut starting = status;
    merge_apply(&mut starting, &patch.body["status"]);
    assert_eq!((starting["stage"].as_str(), starting["phase"].as_str()), (Some("Deploy"), Some("Starting")));
    patch.ok(job_json(starting.clone()));
    // The old inference pod goes first (Sedna's delete-then-create), then the new one.
    let delete = api.expect("DELETE", PODS).await;
    assert_eq!(
        delete.query(),
        format!(
            "labelSelector=lifelonglearningjob.sedna.io/uid={UID},lifelonglearningjob.sedna.io/worker-type=inference"
        )
    );
    delete.ok(pod_list(vec![]));
    let create = api.expect("POST", PODS).await;
    assert!(create.body["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("thermal-inference-")));
    assert_eq!(create.body["spec"]["restartPolicy"], Value::Null, "the template's (Always by default)");
    let env = env_of(&create.body);
    assert!(env.iter().any(|(k, v)| k == "WORKER_NAME" && v.starts_with("inferworker-")));
    let body = create.body.clone();
    create.respond(StatusCode::CREATED, created(body, "thermal-inference-new"));
    assert_eq!(api.only_events().await, ["DeployStarted"]);
    run.await.expect("join").expect("reconciled");

    // The new pod runs and is Ready: the round is done, the model deployed.
    let ready_pod = pod(
        "inference",
        1,
        "thermal-inference-new",
        json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
    );
    api.show_pods(vec![ready_pod]);
    let run = tokio::spawn(reconcile::reconcile(job(starting.clone()), ctx));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let mut done = starting;
    merge_apply(&mut done, &patch.body["status"]);
    assert_eq!((done["stage"].as_str(), done["phase"].as_str()), (Some("Train"), Some("Waiting")));
    assert_eq!(done["roundsCompleted"], 1);
    assert_eq!(done["deployed"]["round"], 1);
    assert_eq!(done["deployed"]["metrics"]["accuracy"], 0.9);
    patch.ok(job_json(done));
    assert!(api.only_events().await.is_empty(), "the round's Deploy was said with its pod");
    run.await.expect("join").expect("reconciled");
}

/// A pod as this operator makes them: with its worker-round label.
fn labelled_pod(kind: &str, round: u64, name: &str, status: Value) -> Value {
    let mut pod = pod(kind, round, name, status);
    pod["metadata"]["labels"]["perennial.io/worker-round"] = json!(format!("{kind}-{round}"));
    pod
}

/// Round 3 evaluated: the job waits in its Deploy, round 2's model serving.
fn deploy_waiting_in_round_3() -> Value {
    let mut waiting = status_after(&[train_ready()]);
    waiting["stage"] = json!("Deploy");
    waiting["phase"] = json!("Waiting");
    waiting["round"] = json!(3);
    waiting["roundsCompleted"] = json!(2);
    waiting["worker"] = Value::Null;
    waiting
}

/// The edge chose round 3's model: its Deploy Ready waits in the inbox.
fn deploy_ready_in_round_3(inbox: &Inbox) {
    let model = json!({"format": "pkl", "url": "/output/thermal/deploy/index.pkl"});
    inbox.deliver("ml", "thermal", report(3, Stage::Deploy, Phase::Ready, json!({"input": {"models": [model]}})));
}

/// Rounds 1 to 3's finished train and eval pods, each with a uid from its name.
fn rounds_pods() -> Vec<Value> {
    let done = json!({"phase": "Succeeded"});
    (1..=3)
        .flat_map(|round| {
            ["train", "eval"]
                .map(|kind| with_uid(labelled_pod(kind, round, &format!("thermal-{kind}-{round}"), done.clone())))
        })
        .collect()
}

/// `pod` with a uid from its name, as the API server gives each pod one.
fn with_uid(mut pod: Value) -> Value {
    pod["metadata"]["uid"] = json!(format!("uid-{}", pod["metadata"]["name"].as_str().unwrap_or_default()));
    pod
}

/// An inference pod's status while it serves.
fn serving() -> Value {
    json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
}

#[tokio::test]
async fn a_deploy_replaces_the_inference_pod_and_prunes_past_rounds_in_one_request() {
    let (mut api, ctx, inbox) = setup();
    // Round 3 evaluated; the edge chose its model. The pods of rounds 1 to 3 are still there,
    // and round 2's inference pod serves.
    let waiting = deploy_waiting_in_round_3();
    deploy_ready_in_round_3(&inbox);
    let mut pods = rounds_pods();
    pods.push(labelled_pod("inference", 2, "thermal-inference-2", serving()));
    api.show_pods(pods.clone());
    let run = tokio::spawn(reconcile::reconcile(job(waiting.clone()), ctx.clone()));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let mut starting = waiting;
    merge_apply(&mut starting, &patch.body["status"]);
    patch.ok(job_json(starting.clone()));
    // One request: round 2's inference pod, and round 1's train and eval pods (rounds 2 and 3
    // kept for `kubectl logs`).
    let delete = api.expect("DELETE", PODS).await;
    assert_eq!(
        delete.query(),
        format!(
            "labelSelector=lifelonglearningjob.sedna.io/uid={UID},perennial.io/worker-round in (eval-1,inference-2,train-1)"
        )
    );
    assert_eq!(delete.body["propagationPolicy"], "Background");
    delete.ok(pod_list(vec![]));
    let create = api.expect("POST", PODS).await;
    assert_eq!(create.body["metadata"]["labels"]["perennial.io/worker-round"], "inference-3");
    let body = create.body.clone();
    create.respond(StatusCode::CREATED, created(body, "thermal-inference-3"));
    assert_eq!(api.only_events().await, ["DeployStarted"]);
    run.await.expect("join").expect("reconciled");

    // The new pod is Ready, before the watch shows the deletions: the round completes, and
    // nothing more is deleted.
    pods.push(labelled_pod("inference", 3, "thermal-inference-3", serving()));
    api.show_pods(pods);
    let run = tokio::spawn(reconcile::reconcile(job(starting.clone()), ctx));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let mut done = starting;
    merge_apply(&mut done, &patch.body["status"]);
    assert_eq!((done["stage"].as_str(), done["roundsCompleted"].as_u64()), (Some("Train"), Some(3)));
    patch.ok(job_json(done));
    assert!(api.only_events().await.is_empty(), "no request after the status");
    run.await.expect("join").expect("reconciled");
}

/// In a namespace of more worker pods than a deletecollection should read (the API server reads
/// every pod of the namespace for one), a Deploy removes the pods it replaces by name, each bound
/// to its uid: the same pods as the one request above.
#[tokio::test]
async fn in_a_crowded_namespace_a_deploy_deletes_each_pod_by_name() {
    let (mut api, ctx, inbox) = setup();
    let waiting = deploy_waiting_in_round_3();
    deploy_ready_in_round_3(&inbox);
    let mut pods = rounds_pods();
    pods.push(with_uid(labelled_pod("inference", 2, "thermal-inference-2", serving())));
    // Other jobs' pods fill the namespace past the bound.
    for i in 0..reconcile::DELETE_BY_NAME_PAST_PODS {
        let mut other = labelled_pod("inference", 1, &format!("other-{i}"), json!({"phase": "Succeeded"}));
        other["metadata"]["labels"]["lifelonglearningjob.sedna.io/uid"] = json!(format!("other-job-{i}"));
        pods.push(other);
    }
    api.show_pods(pods);
    let run = tokio::spawn(reconcile::reconcile(job(waiting.clone()), ctx.clone()));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let mut starting = waiting;
    merge_apply(&mut starting, &patch.body["status"]);
    patch.ok(job_json(starting));
    let mut deleted = Vec::new();
    for _ in 0..3 {
        let call = api.next_call("a delete by name").await;
        assert_eq!(call.method, "DELETE", "{}", call.uri);
        let name = call.path().strip_prefix(&format!("{PODS}/")).expect("a pod's path").to_owned();
        assert_eq!(call.body["preconditions"]["uid"], format!("uid-{name}"), "bound to its uid");
        assert_eq!(call.body["propagationPolicy"], "Background");
        let body = pod("x", 1, &name, json!({}));
        call.ok(body);
        deleted.push(name);
    }
    deleted.sort();
    assert_eq!(deleted, ["thermal-eval-1", "thermal-inference-2", "thermal-train-1"]);
    let create = api.expect("POST", PODS).await;
    assert_eq!(create.body["metadata"]["labels"]["perennial.io/worker-round"], "inference-3");
    let body = create.body.clone();
    create.respond(StatusCode::CREATED, created(body, "thermal-inference-3"));
    assert_eq!(api.only_events().await, ["DeployStarted"]);
    run.await.expect("join").expect("reconciled");
}

#[tokio::test]
async fn a_round_that_deploys_nothing_prunes_past_rounds_when_it_completes() {
    let (mut api, ctx, inbox) = setup();
    let waiting = deploy_waiting_in_round_3();
    // The selector chose no model: Deploy completes from the edge's report, no pod made.
    let mut chose_none = report(3, Stage::Deploy, Phase::Completed, json!({}));
    chose_none.reason = Some("no candidate beats the deployed model".into());
    inbox.deliver("ml", "thermal", chose_none);
    api.show_pods(rounds_pods());
    let run = tokio::spawn(reconcile::reconcile(job(waiting.clone()), ctx));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let mut completed = waiting;
    merge_apply(&mut completed, &patch.body["status"]);
    assert_eq!(completed["roundsCompleted"], 3);
    patch.ok(job_json(completed));
    let delete = api.expect("DELETE", PODS).await;
    assert_eq!(
        delete.query(),
        format!(
            "labelSelector=lifelonglearningjob.sedna.io/uid={UID},lifelonglearningjob.sedna.io/worker-type in (train,eval),perennial.io/round notin (2,3)"
        )
    );
    delete.ok(pod_list(vec![]));
    api.only_events().await; // and no other call
    run.await.expect("join").expect("reconciled");
}

#[tokio::test]
async fn a_pod_deleted_while_running_is_recreated_and_counted_then_fails_over_the_limit() {
    let (mut api, ctx, _inbox) = setup();
    let mut running = status_after(&[train_ready()]);
    running["phase"] = json!("Running");
    running["worker"]["name"] = json!("thermal-train-x7k2p");
    let run = tokio::spawn(reconcile::reconcile(job(running.clone()), ctx.clone()));
    // The store lacks it: the API server is asked before the worker is taken for gone.
    let read = api.expect("GET", PODS).await;
    assert_eq!(read.query(), format!("labelSelector=lifelonglearningjob.sedna.io/uid={UID}"));
    read.ok(pod_list(vec![]));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(patch.body["status"]["worker"]["recreations"], 1);
    assert_eq!(patch.body["status"]["phase"], Value::Null, "still Running: no new condition");
    let mut after = running.clone();
    merge_apply(&mut after, &patch.body["status"]);
    patch.ok(job_json(after));
    let create = api.expect("POST", PODS).await;
    assert_eq!(create.body["metadata"]["labels"]["perennial.io/round"], "1");
    // The vanished one's name: were it still there, the create would find it (409), not make two.
    assert_eq!(create.body["metadata"]["name"], worker_pod_name("thermal", &start("train", 1, 0)));
    let body = create.body.clone();
    create.respond(StatusCode::CREATED, created(body, "thermal-train-again"));
    assert_eq!(api.only_events().await, ["WorkerVanished", "WorkerCreated"]);
    run.await.expect("join").expect("reconciled");

    // Gone again with the restarts at the limit: the stage fails and backs off.
    running["worker"]["restarts"] = json!(3);
    running["worker"]["recreations"] = json!(3);
    let run = tokio::spawn(reconcile::reconcile(job(running), ctx));
    api.expect("GET", PODS).await.ok(pod_list(vec![]));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let status = patch.body["status"].clone();
    assert_eq!(status["phase"], "Failed");
    assert_eq!(status["retries"], 1);
    patch.ok(job_json(status));
    // The worker is gone: nothing to stop, so no request (only the Event).
    assert_eq!(api.only_events().await, ["StageFailed"]);
    let requeue = run.await.expect("join").expect("reconciled");
    assert_eq!(requeue, kube::runtime::controller::Action::requeue(Duration::from_secs(10)), "Sedna's first backoff");
}

/// The pod store behind (or a pod created here and forgotten): the worker the API server still
/// has is followed, not made a second time.
#[tokio::test]
async fn a_worker_the_store_lacks_but_the_api_server_has_is_not_made_again() {
    let (mut api, ctx, _inbox) = setup();
    let mut running = status_after(&[train_ready()]);
    running["phase"] = json!("Running");
    running["worker"]["name"] = json!("thermal-train-x7k2p");
    running["worker"]["node"] = json!("edge-1");
    let run = tokio::spawn(reconcile::reconcile(job(running), ctx));
    let read = api.expect("GET", PODS).await;
    let there = pod("train", 1, "thermal-train-x7k2p", json!({"phase": "Running"}));
    read.ok(pod_list(vec![there]));
    // Still running, as the pod says: no status write, no pod created, no WorkerVanished.
    assert_eq!(api.only_events().await, Vec::<String>::new());
    run.await.expect("join").expect("reconciled");
}

/// An operator process that died with its create in flight, and the one after it that creates
/// the same start again: the API server has the pod by that name already. It is the worker: no
/// error, no second pod, not counted or said as created again.
#[tokio::test]
async fn a_create_of_a_start_whose_pod_exists_already_takes_that_pod() {
    let (mut api, ctx, _inbox) = setup();
    let mut starting = status_after(&[train_ready()]);
    starting["worker"]["name"] = json!("");
    let run = tokio::spawn(reconcile::reconcile(job(starting.clone()), ctx.clone()));
    // Neither the store nor the API server's list shows it yet (the create was in flight).
    api.expect("GET", PODS).await.ok(pod_list(vec![]));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(patch.body["status"]["worker"]["recreations"], 1);
    let mut after = starting.clone();
    merge_apply(&mut after, &patch.body["status"]);
    patch.ok(job_json(after));
    let create = api.expect("POST", PODS).await;
    let name = worker_pod_name("thermal", &start("train", 1, 0));
    assert_eq!(create.body["metadata"]["name"], name.as_str());
    let exists = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists",
                        "code": 409, "message": format!("pods \"{name}\" already exists")});
    create.respond(StatusCode::CONFLICT, exists);
    assert_eq!(api.only_events().await, ["WorkerVanished"], "no WorkerCreated, no WorkerNotCreated");
    run.await.expect("join").expect("reconciled, not an error");
    assert!(!ctx.metrics.render().contains("perennial_operator_pods_created_total{worker=\"train\"}"));
}

/// A 409 that is not AlreadyExists (a ResourceQuota changed under the create) made no pod: an
/// error said on the job and retried, never taken for the worker.
#[tokio::test]
async fn a_create_refused_with_a_conflict_is_an_error_not_the_worker() {
    let (mut api, ctx, inbox) = setup();
    let waiting = status_after(&[]);
    let _receipt = inbox.deliver("ml", "thermal", train_ready());
    let run = tokio::spawn(reconcile::reconcile(job(waiting), ctx));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let status = patch.body["status"].clone();
    patch.ok(job_json(status));
    let create = api.expect("POST", PODS).await;
    let quota = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
        "message": "Operation cannot be fulfilled on resourcequotas \"compute\": the object has been modified"});
    create.respond(StatusCode::CONFLICT, quota);
    let events = api.only_events().await;
    assert!(events.iter().any(|reason| reason == "WorkerNotCreated"), "{events:?}");
    assert!(run.await.expect("join").is_err(), "an error, retried with backoff");
}

#[tokio::test]
async fn a_status_conflict_is_retried_from_the_watchs_newer_copy_without_a_read() {
    let (mut api, ctx, inbox) = setup();
    let waiting = status_after(&[]);
    api.jobs.apply_watcher_event(&watcher::Event::Apply((*job(waiting.clone())).clone()));
    let receipt = inbox.deliver("ml", "thermal", train_ready());
    let run = tokio::spawn(reconcile::reconcile(job(waiting.clone()), ctx));
    let first = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(first.body["metadata"]["resourceVersion"], "10");
    // The edge's policies were written meanwhile; the watch shows them a moment after the 409.
    first.respond(StatusCode::CONFLICT, conflict());
    let mut theirs = job_json(waiting);
    theirs["metadata"]["resourceVersion"] = json!("11");
    theirs["status"]["policies"] =
        json!({"trigger": {"plugin": "builtin:threshold-trigger", "digest": "sha256:ab", "health": "Serving"}});
    tokio::time::sleep(Duration::from_millis(50)).await;
    api.jobs.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(theirs).expect("a job")));
    // No GET: the second write is made from the watch's copy.
    let second = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(second.body["metadata"]["resourceVersion"], "11", "made from the watch's newer copy");
    assert_eq!(second.body["status"].get("policies"), None, "theirs kept, untouched");
    let status = second.body["status"].clone();
    second.ok(job_json(status));
    api.train_pod("thermal-train-x7k2p").await;
    assert_eq!(api.only_events().await, ["TrainStarted"]);
    run.await.expect("join").expect("reconciled");
    receipt.await.expect("applied once the write succeeded");
}

#[tokio::test]
async fn a_status_conflict_is_retried_from_a_fresh_read_keeping_the_concurrent_condition() {
    let (mut api, ctx, inbox) = setup();
    let waiting = status_after(&[]);
    let receipt = inbox.deliver("ml", "thermal", train_ready());
    let run = tokio::spawn(reconcile::reconcile(job(waiting.clone()), ctx));
    let first = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(first.body["metadata"]["resourceVersion"], "10");
    first.respond(StatusCode::CONFLICT, conflict());
    // Someone else wrote meanwhile: a condition and a policy's health.
    let mut theirs = waiting.clone();
    let concurrent = json!({"type": "Waiting", "status": "True", "stage": "Train", "reason": "EdgeReconnected",
                            "lastHeartbeatTime": "2026-12-01T00:00:30Z"});
    theirs["conditions"].as_array_mut().expect("conditions").push(concurrent.clone());
    theirs["policies"] =
        json!({"trigger": {"plugin": "builtin:threshold-trigger", "digest": "sha256:ab", "health": "Serving"}});
    let mut fresh = job_json(theirs);
    fresh["metadata"]["resourceVersion"] = json!("11");
    api.expect("GET", &format!("{JOBS}/thermal")).await.ok(fresh);
    let second = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(second.body["metadata"]["resourceVersion"], "11", "made from the fresh read");
    let conditions = second.body["status"]["conditions"].as_array().expect("conditions").clone();
    assert!(conditions.contains(&concurrent), "the concurrent condition is kept: {conditions:?}");
    assert_eq!(conditions.last().map(|c| c["type"].clone()), Some(json!("Starting")));
    assert_eq!(second.body["status"].get("policies"), None, "untouched fields are not in the patch");
    let status = second.body["status"].clone();
    second.ok(job_json(status));
    api.train_pod("thermal-train-x7k2p").await;
    assert_eq!(api.only_events().await, ["TrainStarted"]);
    run.await.expect("join").expect("reconciled");
    receipt.await.expect("applied once the write succeeded");
}

#[tokio::test]
async fn an_unwritten_status_acts_on_nothing_and_keeps_the_report() {
    let (mut api, ctx, inbox) = setup();
    inbox.deliver("ml", "thermal", train_ready());
    let run = tokio::spawn(reconcile::reconcile(job(status_after(&[])), ctx));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    patch.respond(
        StatusCode::FORBIDDEN,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
               "message": "forbidden"}),
    );
    let error = run.await.expect("join").expect_err("the write failed");
    assert!(error.to_string().contains("patch_status for ml/thermal"), "{error}");
    assert!(api.only_events().await.is_empty(), "no pod, no event");
    assert_eq!(inbox.peek("ml", "thermal").len(), 1, "the report waits for the next try");
}

#[tokio::test]
async fn a_deleted_job_removes_its_pods_then_its_finalizer() {
    let (mut api, ctx, inbox) = setup();
    let mut deleting = job_json(status_after(&[]));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:10:00Z");
    let deleting: Arc<LifelongLearningJob> = Arc::new(serde_json::from_value(deleting).expect("job"));
    inbox.deliver("ml", "thermal", train_ready());
    let run = tokio::spawn(reconcile::reconcile(deleting, ctx));
    let delete = api.expect("DELETE", PODS).await;
    assert_eq!(delete.query(), format!("labelSelector=lifelonglearningjob.sedna.io/uid={UID}"));
    assert_eq!(delete.body["propagationPolicy"], "Background");
    delete.ok(pod_list(vec![]));
    let unfinalize = api.expect("PATCH", &format!("{JOBS}/thermal")).await;
    assert_eq!(
        unfinalize.body,
        json!([{"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
               {"op": "remove", "path": "/metadata/finalizers/0"}])
    );
    unfinalize.ok(job_json(Value::Null));
    run.await.expect("join").expect("reconciled");
    assert_eq!(api.only_events().await, ["Deleted"]);
    assert!(inbox.peek("ml", "thermal").is_empty(), "the edge's reports for it are dropped");
}

#[tokio::test]
async fn dataset_status_is_a_merge_patch_of_its_two_fields() {
    let (mut api, ctx, _inbox) = setup();
    let write = tokio::spawn(reconcile::write_dataset_status(ctx.client.clone(), "ml", "thermal-data", 1234));
    let patch = api.expect("PATCH", "/apis/sedna.io/v1alpha1/namespaces/ml/datasets/thermal-data/status").await;
    assert_eq!(patch.body["status"]["numberOfSamples"], 1234);
    assert!(patch.body["status"]["updateTime"].is_string());
    assert_eq!(patch.body.as_object().map(|o| o.len()), Some(1), "only the status");
    patch.ok(dataset_json());
    write.await.expect("join").expect("written");
}

#[tokio::test]
async fn an_invalid_spec_is_said_on_the_job_and_in_its_status_and_nothing_else_happens() {
    let (mut api, ctx, _inbox) = setup();
    let mut bad = job_json(status_after(&[]));
    bad["spec"]["dataset"]["trainProb"] = json!(1.5);
    let bad: Arc<LifelongLearningJob> = Arc::new(serde_json::from_value(bad).expect("job"));
    let run = tokio::spawn(reconcile::reconcile(bad, ctx));
    // The refusal in status.message: a merge patch of that field alone.
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let message = patch.body["status"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.starts_with("refused: ") && message.contains("spec.dataset.trainProb"), "{message}");
    assert_eq!(patch.body["status"].as_object().map(|o| o.len()), Some(1), "{}", patch.body);
    let mut status = status_after(&[]);
    status["message"] = json!(message);
    patch.ok(job_json(status));
    let (reason, kind, note) = api.event().await;
    assert_eq!((reason.as_str(), kind.as_str()), ("InvalidSpec", "Warning"));
    assert!(note.contains("trainProb"), "{note}");
    assert_eq!(run.await.expect("join").expect("reconciled"), kube::runtime::controller::Action::await_change());
    assert!(api.only_events().await.is_empty());
}

#[tokio::test]
async fn a_status_made_from_a_stale_cache_is_refused_and_made_again_from_a_fresh_read() {
    let (mut api, ctx, inbox) = setup();
    // The watch still shows the last round's deploy; the job has moved on to Train/Waiting.
    let mut cached = status_after(&[]);
    cached["stage"] = json!("Deploy");
    cached["phase"] = json!("Starting");
    let receipt = inbox.deliver("ml", "thermal", train_ready());
    let run = tokio::spawn(reconcile::reconcile(job(cached), ctx));
    // Made from the cache (its pod looks vanished, which a read of the pods confirms) under the
    // cache's version: refused.
    api.expect("GET", PODS).await.ok(pod_list(vec![]));
    let stale = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(stale.body["metadata"]["resourceVersion"], "10");
    stale.respond(StatusCode::CONFLICT, conflict());
    let mut fresh = job_json(status_after(&[]));
    fresh["metadata"]["resourceVersion"] = json!("12");
    api.expect("GET", &format!("{JOBS}/thermal")).await.ok(fresh);
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(patch.body["metadata"]["resourceVersion"], "12");
    assert_eq!(
        (patch.body["status"]["phase"].as_str(), patch.body["status"]["round"].as_u64()),
        (Some("Starting"), Some(1))
    );
    let status = patch.body["status"].clone();
    patch.ok(job_json(status));
    api.train_pod("thermal-train-x7k2p").await;
    assert_eq!(api.only_events().await, ["TrainStarted"], "nothing from the cache");
    run.await.expect("join").expect("reconciled");
    receipt.await.expect("applied, not dropped as stale");
}

#[tokio::test]
async fn a_report_that_changes_nothing_against_the_cache_is_judged_again_against_a_fresh_read() {
    let (mut api, ctx, inbox) = setup();
    // The watch still shows the last round's eval waiting; the job has moved on to Train/Waiting.
    // Against the cache the report is for another stage: stale, no change to write.
    let mut cached = status_after(&[]);
    cached["stage"] = json!("Eval");
    let receipt = inbox.deliver("ml", "thermal", train_ready());
    let run = tokio::spawn(reconcile::reconcile(job(cached), ctx));
    let mut fresh = job_json(status_after(&[]));
    fresh["metadata"]["resourceVersion"] = json!("12");
    api.expect("GET", &format!("{JOBS}/thermal")).await.ok(fresh);
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(patch.body["metadata"]["resourceVersion"], "12");
    assert_eq!(patch.body["status"]["phase"], "Starting");
    let status = patch.body["status"].clone();
    patch.ok(job_json(status));
    api.train_pod("thermal-train-x7k2p").await;
    assert_eq!(api.only_events().await, ["TrainStarted"], "no StaleReport");
    run.await.expect("join").expect("reconciled");
    receipt.await.expect("applied, not dropped as stale");
}

/// A Dataset its watch does not show (deleted since the edge heard of the job) is not read from
/// the API server (the operator has no `get` on Datasets): the stage's pod waits, and says why.
#[tokio::test]
async fn a_dataset_the_watch_does_not_show_is_waited_for_not_read() {
    let (mut api, ctx, inbox) = setup();
    api.forget_datasets();
    inbox.deliver("ml", "thermal", train_ready());
    let run = tokio::spawn(reconcile::reconcile(job(status_after(&[])), ctx));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    let status = patch.body["status"].clone();
    patch.ok(job_json(status));
    let events = api.only_events().await;
    assert!(events.iter().any(|reason| reason == "WorkerNotCreated"), "{events:?}");
    let error = run.await.expect("join").expect_err("no pod without its Dataset");
    assert!(format!("{error:?}").contains("DatasetMissing"), "{error:?}");
}

#[tokio::test]
async fn a_deploy_restarted_after_a_crash_removes_the_old_inference_pod_first() {
    let (mut api, ctx, _inbox) = setup();
    // Deploy/Starting of round 1 written, then the operator died before the old pod was deleted.
    let model = json!({"format": "pkl", "url": "/output/thermal/deploy/index.pkl"});
    let mut status = status_after(&[train_ready()]);
    status["stage"] = json!("Deploy");
    status["data"] = json!({"input": {"models": [model]}});
    status["worker"]["stage"] = json!("Deploy");
    let old = pod("inference", 0, "thermal-inference-old", json!({"phase": "Running"}));
    api.show_pods(vec![old.clone()]);
    let run = tokio::spawn(reconcile::reconcile(job(status), ctx));
    api.expect("GET", PODS).await.ok(pod_list(vec![old]));
    let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
    assert_eq!(patch.body["status"]["worker"]["recreations"], 1);
    patch.ok(job_json(Value::Null));
    let delete = api.expect("DELETE", PODS).await;
    assert!(delete.query().ends_with("worker-type=inference"), "{}", delete.query());
    delete.ok(pod_list(vec![]));
    let create = api.expect("POST", PODS).await;
    assert_eq!(create.body["metadata"]["labels"]["perennial.io/round"], "1");
    let body = create.body.clone();
    create.respond(StatusCode::CREATED, created(body, "thermal-inference-new"));
    assert_eq!(api.only_events().await, ["WorkerVanished", "WorkerCreated"]);
    run.await.expect("join").expect("reconciled");
}

/// The operator's side of the edge link: what a node reports, applied and acknowledged.
mod link {
    use perennial_link::cloud_server::{Applied, CloudSide};
    use perennial_operator::link::{NodeBook, OperatorSide};

    use super::*;

    fn side(ctx: &Arc<Context>, inbox: &Arc<Inbox>) -> Arc<OperatorSide> {
        let book = Arc::new(NodeBook::default());
        Arc::new(OperatorSide::new(book, inbox.clone(), ctx.client.clone(), ctx.written_jobs.clone()))
    }

    #[tokio::test]
    async fn an_edge_report_is_applied_through_the_stage_machine_and_acknowledged_once_written() {
        let (mut api, ctx, inbox) = setup();
        let side = side(&ctx, &inbox);
        let body = json!({"job": "ml/thermal", "jobUid": UID, "round": 1, "phase": "Train", "status": "Ready",
                          "input": {"dataURL": "/output/thermal/data/train/1/data.txt", "outputDir": "/output/thermal/train/1"}});
        let applying = tokio::spawn({
            let side = side.clone();
            async move { side.apply("edge-1", 7, body).await }
        });
        // Handed to the inbox, not yet acknowledged: the status is not written.
        while inbox.peek("ml", "thermal").is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!applying.is_finished());
        assert_eq!(side.last_applied_report("edge-1").await, Ok(0));
        let waiting = status_after(&[]);
        let run = tokio::spawn(reconcile::reconcile(job(waiting.clone()), ctx.clone()));
        let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
        assert_eq!(patch.body["status"]["phase"], "Starting", "the report was applied");
        let status = patch.body["status"].clone();
        patch.ok(job_json(status));
        api.train_pod("thermal-train-x7k2p").await;
        assert_eq!(api.only_events().await, ["TrainStarted"]);
        run.await.expect("join").expect("reconciled");
        let applied = tokio::time::timeout(Duration::from_secs(1), applying).await.expect("answered").expect("join");
        assert_eq!(applied, Applied::Applied);
        assert_eq!(side.last_applied_report("edge-1").await, Ok(7), "the node's watermark moved");
    }

    #[tokio::test]
    async fn the_policies_an_edge_runs_replace_the_jobs_policies_in_its_status() {
        let (mut api, ctx, inbox) = setup();
        let side = side(&ctx, &inbox);
        let trigger = json!({"plugin": "oci://x/t:1", "digest": "ab12", "health": "LoadFailed",
                             "message": "rejected oci://x/t:2: configure refused; the previous one serves"});
        let body = json!({"job": "ml/thermal", "jobUid": UID, "policies": {"trigger": trigger}});
        let applying = tokio::spawn(async move { side.apply("edge-1", 3, body).await });
        let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
        assert_eq!(
            patch.body,
            json!({"status": {"policies": {"trigger": trigger, "splitter": null, "selector": null}}}),
            "every kind said: one the edge no longer runs is removed"
        );
        patch.ok(job_json(Value::Null));
        assert_eq!(applying.await.expect("join"), Applied::Applied);

        // The edge's repeating error goes with them, and its end clears it.
        let side = self::side(&ctx, &inbox);
        let fault = "ingest: index.csv: not a regular file (a folder) (since 2026-12-02T04:24:53Z)";
        let body = json!({"job": "ml/thermal", "jobUid": UID, "policies": {"trigger": trigger}, "fault": fault});
        let applying = tokio::spawn(async move { side.apply("edge-1", 4, body).await });
        let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
        assert_eq!(patch.body["status"]["fault"], fault);
        patch.ok(job_json(Value::Null));
        assert_eq!(applying.await.expect("join"), Applied::Applied);
        let side = self::side(&ctx, &inbox);
        let body = json!({"job": "ml/thermal", "jobUid": UID, "policies": {"trigger": trigger}, "fault": null});
        let applying = tokio::spawn(async move { side.apply("edge-1", 5, body).await });
        let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
        assert!(patch.body["status"].get("fault").is_some_and(Value::is_null), "{}", patch.body);
        patch.ok(job_json(Value::Null));
        assert_eq!(applying.await.expect("join"), Applied::Applied);
    }

    #[tokio::test]
    async fn a_report_resent_that_changes_nothing_is_not_written_again() {
        let (mut api, ctx, inbox) = setup();
        let trigger = json!({"plugin": "builtin:threshold-trigger", "digest": "ab12", "health": "Serving"});
        let mut status = status_after(&[]);
        status["policies"] = json!({"trigger": trigger});
        api.jobs.apply_watcher_event(&watcher::Event::Apply((*job(status)).clone()));
        let mut dataset = dataset_json();
        dataset["status"] = json!({"numberOfSamples": 120});
        api.datasets.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(dataset).expect("a dataset")));
        let book = Arc::new(NodeBook::default());
        let side = OperatorSide::new(book, inbox.clone(), ctx.client.clone(), ctx.written_jobs.clone());
        let side = side.with_stores(ctx.stores.clone());
        // As the job and the Dataset already say (an edge resending after a restart): no call.
        let same = json!({"job": "ml/thermal", "jobUid": UID, "policies": {"trigger": trigger, "selector": null}});
        assert_eq!(side.apply("edge-1", 1, same).await, Applied::Applied);
        let count = json!({"dataset": "ml/thermal-data", "numberOfSamples": 120});
        assert_eq!(side.apply("edge-1", 2, count).await, Applied::Applied);
        // A change is written.
        let side = Arc::new(side);
        let newer = json!({"dataset": "ml/thermal-data", "numberOfSamples": 150});
        let applying = tokio::spawn({
            let side = side.clone();
            async move { side.apply("edge-1", 3, newer).await }
        });
        let patch = api.expect("PATCH", "/apis/sedna.io/v1alpha1/namespaces/ml/datasets/thermal-data/status").await;
        assert_eq!(patch.body["status"]["numberOfSamples"], 150);
        patch.ok(dataset_json());
        assert_eq!(applying.await.expect("join"), Applied::Applied);
        let fault = json!({"job": "ml/thermal", "jobUid": UID, "policies": {"trigger": trigger}, "fault": "ingest: x"});
        let applying = tokio::spawn(async move { side.apply("edge-1", 4, fault).await });
        let patch = api.expect("PATCH", &format!("{JOBS}/thermal/status")).await;
        assert_eq!(patch.body["status"]["fault"], "ingest: x");
        patch.ok(job_json(Value::Null));
        assert_eq!(applying.await.expect("join"), Applied::Applied);
    }

    #[tokio::test]
    async fn a_dataset_count_is_written_and_a_gone_dataset_refused() {
        let (mut api, ctx, inbox) = setup();
        let side = side(&ctx, &inbox);
        let path = "/apis/sedna.io/v1alpha1/namespaces/ml/datasets/thermal-data/status";
        let body = json!({"dataset": "ml/thermal-data", "numberOfSamples": 250});
        let applying = tokio::spawn({
            let side = side.clone();
            async move { side.apply("edge-1", 4, body).await }
        });
        let patch = api.expect("PATCH", path).await;
        assert_eq!(patch.body["status"]["numberOfSamples"], 250);
        patch.ok(dataset_json());
        assert_eq!(applying.await.expect("join"), Applied::Applied);

        let applying = tokio::spawn(async move {
            side.apply("edge-1", 5, json!({"dataset": "ml/thermal-data", "numberOfSamples": 260})).await
        });
        let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                          "message": "datasets \"thermal-data\" not found", "code": 404});
        api.expect("PATCH", path).await.respond(StatusCode::NOT_FOUND, gone);
        assert_eq!(applying.await.expect("join"), Applied::Rejected("dataset ml/thermal-data is gone".into()));
    }
}
