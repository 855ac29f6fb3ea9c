//! The worker report API on a real loopback socket, called the way Sedna's worker library
//! calls it.

use std::sync::{Arc, Mutex};

use perennial_edge::report;
use perennial_edge::serve::{Limits, serve_with};
use perennial_edge::sqlite::Store;
use perennial_edge::worker_api::{self, Reply};
use perennial_edge::{self as edge, JobSpec};
use perennial_types::{Phase, Stage};
use serde_json::json;

const JOB: &str = "default/thermal";

struct Api {
    base: String,
    store: Arc<Mutex<Store>>,
    /// The jobs the API said a report moved on (the agent's loop looks at them at once).
    moved: Arc<Mutex<Vec<String>>>,
    db: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn start() -> Api {
    start_with(Limits::DEFAULT).await
}

async fn start_with(limits: Limits) -> Api {
    start_holding(limits, None).await
}

/// A linked agent's API: reports from workers not named yet are held for `hold`.
async fn start_holding(limits: Limits, hold: Option<std::time::Duration>) -> Api {
    // The process's one rustls provider, as `perennial` installs it (reqwest here has none).
    perennial_tls::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let mut store = Store::open(&db).unwrap();
    let spec = JobSpec {
        dataset: "default/thermal-data".into(),
        dataset_url: "/data/thermal/index.csv".into(),
        dataset_format: "csv".into(),
        output_dir: "/output".into(),
        train_prob: 0.8,
        eval_set_size: None,
        decision_records: None,
    };
    edge::register_job(&mut store, JOB, "uid-1", &spec).unwrap();
    let store = Arc::new(Mutex::new(store));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let moved = Arc::new(Mutex::new(Vec::new()));
    let said = moved.clone();
    let on_report = move |job: Option<&str>| said.lock().unwrap().extend(job.map(str::to_owned));
    let router = worker_api::router(store.clone(), Arc::new(on_report), hold);
    tokio::spawn(serve_with(listener, router, limits, std::future::pending()));
    Api { base, store, moved, db, _dir: dir }
}

impl Api {
    fn issue(&self, round: i64, stage: &str) -> String {
        worker_api::issue_worker_name(self.store.lock().unwrap().conn(), JOB, round, stage).unwrap()
    }

    async fn post(&self, worker: &str, body: serde_json::Value) -> (u16, Reply) {
        self.post_raw(worker, body.to_string()).await
    }

    async fn post_raw(&self, worker: &str, body: String) -> (u16, Reply) {
        let response = reqwest::Client::new()
            .post(format!("{}/sedna/workers/{worker}/info", self.base))
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    fn outbox(&self) -> Vec<report::Report> {
        report::pending(&self.store.lock().unwrap(), 100).unwrap().into_iter().map(|(_, r)| r).collect()
    }
}

/// What Sedna's library sends at the end of a train worker.
fn sedna_body(worker: &str, kind: &str, url: &str) -> serde_json::Value {
    json!({
        "name": worker, "namespace": "default", "ownerName": "thermal",
        "ownerKind": "lifelonglearningjob", "kind": kind, "status": "completed",
        "results": [{"format": "pkl", "url": url, "metrics": null}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sedna_report_is_committed_before_ok_and_a_repeat_is_harmless() {
    let api = start().await;
    let worker = api.issue(1, "train");
    assert!(worker.starts_with("train-worker-") && worker.len() > 30, "{worker}");
    let body = sedna_body(&worker, "train", "/output/train/1/index.pkl");
    assert_eq!(api.post(&worker, body.clone()).await, (200, Reply { status: 200, message: "OK".into() }));
    // Committed: another connection to the database file sees it.
    let other = rusqlite::Connection::open(&api.db).unwrap();
    let stored: String = other
        .query_row("SELECT body FROM results WHERE job = ?1 AND round = 1 AND stage = 'train'", [JOB], |r| r.get(0))
        .unwrap();
    assert!(stored.contains("/output/train/1/index.pkl"));
    let relayed = api.outbox();
    assert_eq!(relayed.len(), 1);
    assert_eq!((relayed[0].phase, relayed[0].status, relayed[0].round), (Stage::Train, Phase::Completed, 1));
    assert_eq!(relayed[0].job_uid, "uid-1");

    assert_eq!(api.post(&worker, body).await.0, 200, "a repeat is accepted");
    assert_eq!(api.outbox().len(), 1, "and relayed once");
}

impl Api {
    /// What the link does when the control plane's desired state names `worker`.
    fn name(&self, worker: &str, round: i64, stage: &str) -> Vec<String> {
        let mut store = self.store.lock().unwrap();
        let tx = store.write().unwrap();
        tx.execute(
            "INSERT OR IGNORE INTO workers (name, job, round, stage) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![worker, JOB, round, stage],
        )
        .unwrap();
        let refused = worker_api::release_held(&tx, worker).unwrap();
        tx.commit().unwrap();
        refused
    }
}

/// A linked agent after the operator restarted: the worker reports before the link is back and
/// names it. The report is held, not refused, and taken once when the name arrives; a name that
/// never arrives takes nothing, and a flood of unknown names is bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_before_its_workers_name_is_held_and_taken_once_named() {
    let api = start_holding(Limits::DEFAULT, Some(std::time::Duration::from_secs(600))).await;
    let worker = worker_api::new_worker_name("train").unwrap();
    let body = sedna_body(&worker, "train", "/output/train/3/index.pkl");
    let (status, reply) = api.post(&worker, body.clone()).await;
    assert_eq!(status, 200, "{reply:?}");
    assert!(reply.message.starts_with("held"), "{reply:?}");
    assert!(api.outbox().is_empty(), "relayed before the worker was named");
    // Held durably: in the database file, not in memory.
    let other = rusqlite::Connection::open(&api.db).unwrap();
    let held: i64 = other.query_row("SELECT count(*) FROM held_reports", [], |r| r.get(0)).unwrap();
    assert_eq!(held, 1);
    // A model outside the job's folders is refused at once, named or not.
    let outside = sedna_body(&worker, "train", "/etc/passwd");
    assert_eq!(api.post(&worker, outside).await.0, 403);

    assert!(api.name(&worker, 3, "train").is_empty());
    let relayed = api.outbox();
    assert_eq!(relayed.len(), 1, "{relayed:?}");
    assert_eq!((relayed[0].phase, relayed[0].status, relayed[0].round), (Stage::Train, Phase::Completed, 3));
    // Named again (the desired state resent), and the worker's own repeat: taken once.
    assert!(api.name(&worker, 3, "train").is_empty());
    assert_eq!(api.post(&worker, body).await, (200, Reply { status: 200, message: "OK".into() }));
    assert_eq!(api.outbox().len(), 1);

    // Names that never arrive: at most MAX_HELD_PER_JOB held for the job, then 503.
    for i in 0..worker_api::MAX_HELD_PER_JOB {
        let forged = worker_api::new_worker_name("eval").unwrap();
        let (status, reply) = api.post(&forged, sedna_body(&forged, "eval", "/output/eval/9/m.pkl")).await;
        assert_eq!(status, 200, "held {i}: {reply:?}");
    }
    let forged = worker_api::new_worker_name("eval").unwrap();
    let (status, reply) = api.post(&forged, sedna_body(&forged, "eval", "/output/eval/9/m.pkl")).await;
    assert_eq!(status, 503, "{reply:?}");
    assert_eq!(api.outbox().len(), 1, "a forged name took something");
}

/// Held reports expire: a name that arrives after the grace takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_report_expires_after_its_grace() {
    let api = start_holding(Limits::DEFAULT, Some(std::time::Duration::ZERO)).await;
    let worker = worker_api::new_worker_name("train").unwrap();
    assert_eq!(api.post(&worker, sedna_body(&worker, "train", "/output/train/1/index.pkl")).await.0, 200);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert!(api.name(&worker, 1, "train").is_empty());
    assert!(api.outbox().is_empty(), "an expired report was taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_unknown_malformed_and_traversing_reports_are_refused() {
    let api = start().await;
    let worker = api.issue(1, "train");

    let forged = "train-worker-0123456789abcdef01234567";
    let (status, reply) = api.post(forged, sedna_body(forged, "train", "/output/train/1/index.pkl")).await;
    assert_eq!((status, reply.status), (403, 403));
    assert_eq!(reply.message, format!("worker {forged} was not started by this agent"));

    let (status, reply) = api.post(&worker, sedna_body(&worker, "eval", "/output/eval/1/index.pkl")).await;
    assert_eq!(status, 403);
    assert!(reply.message.contains("was started for the train stage"), "{}", reply.message);

    let mut unknown = sedna_body(&worker, "train", "/output/train/1/index.pkl");
    unknown["ownerName"] = json!("nope");
    let (status, reply) = api.post(&worker, unknown).await;
    assert_eq!((status, reply.message.as_str()), (404, "job default/nope is not known to this agent"));

    let (status, reply) = api.post_raw(&worker, "{not json".into()).await;
    assert_eq!(status, 400);
    assert!(reply.message.starts_with("body: "), "{}", reply.message);
    let mut no_status = sedna_body(&worker, "train", "/output/train/1/index.pkl");
    no_status.as_object_mut().unwrap().remove("status");
    assert_eq!(api.post(&worker, no_status).await, (400, Reply { status: 400, message: "status: missing".into() }));
    let mut bad_kind = sedna_body(&worker, "train", "/output/train/1/index.pkl");
    bad_kind["ownerKind"] = json!("jointinferenceservice");
    assert_eq!(api.post(&worker, bad_kind).await.0, 400);
    let mut renamed = sedna_body(&worker, "train", "/output/train/1/index.pkl");
    renamed["name"] = json!("someone-else");
    let (status, reply) = api.post(&worker, renamed).await;
    assert_eq!(status, 400);
    assert!(reply.message.starts_with("name: "), "{}", reply.message);

    for url in ["/output/../etc/shadow", "/etc/passwd", "/output-other/x.pkl"] {
        let (status, reply) = api.post(&worker, sedna_body(&worker, "train", url)).await;
        assert_eq!(status, 403, "{url}");
        assert!(reply.message.starts_with("results[0].url: "), "{}", reply.message);
    }
    assert!(api.outbox().is_empty(), "nothing refused was relayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_a_url_other_metrics_and_an_oversized_body_get_sednas_reply() {
    let api = start().await;
    let worker = api.issue(1, "train");
    let mut body = sedna_body(&worker, "train", "/output/train/1/index.pkl\u{0}.x");
    let (status, reply) = api.post(&worker, body.clone()).await;
    assert_eq!((status, reply.status), (400, 400));
    assert_eq!(reply.message, "results[0].url: contains a NUL character");
    body["results"][0]["url"] = json!("/output/train/1/index.pkl");
    body["results"][0]["metrics"] = json!([0.9, 0.8]);
    let (status, reply) = api.post(&worker, body.clone()).await;
    assert_eq!(status, 400);
    assert_eq!(reply.message, "results[0].metrics: [0.9,0.8] is not an object of named metrics");
    // Over the 2 MB body limit: 413, in Sedna's JSON like any refusal.
    body["results"][0]["metrics"] = json!({"note": "x".repeat(3 << 20)});
    let (status, reply) = api.post(&worker, body).await;
    assert_eq!((status, reply.status), (413, 413), "{reply:?}");
    assert!(reply.message.starts_with("body: "), "{reply:?}");
    assert!(api.outbox().is_empty(), "nothing refused is stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_report_is_relayed_as_failed() {
    let api = start().await;
    let worker = api.issue(2, "eval");
    let mut body = sedna_body(&worker, "eval", "/output/eval/2/index.pkl");
    body["status"] = json!("failed");
    body.as_object_mut().unwrap().remove("results");
    assert_eq!(api.post(&worker, body).await.0, 200);
    let relayed = api.outbox();
    assert_eq!((relayed[0].phase, relayed[0].status, relayed[0].round), (Stage::Eval, Phase::Failed, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_are_relayed_once_and_a_completed_report_needs_a_model() {
    let api = start().await;
    let worker = api.issue(1, "train");
    let mut empty = sedna_body(&worker, "train", "/output/train/1/index.pkl");
    empty["results"] = json!([]);
    let (status, reply) = api.post(&worker, empty).await;
    assert_eq!((status, reply.message.as_str()), (400, "results: a completed train report needs at least one model"));

    let mut failed = sedna_body(&worker, "train", "/output/train/1/index.pkl");
    failed["status"] = json!("failed");
    assert_eq!(api.post(&worker, failed.clone()).await.0, 200);
    assert_eq!(api.post(&worker, failed).await.0, 200);
    assert_eq!(api.outbox().len(), 1, "a repeated failure is relayed once");
    // A different report from the same worker (completed after failed) is refused: the stage
    // took its first report, as the stage machine does.
    let (status, reply) = api.post(&worker, sedna_body(&worker, "train", "/output/train/1/index.pkl")).await;
    assert_eq!(status, 409, "{reply:?}");
    assert!(reply.message.contains("round 1's train already reported failed"), "{reply:?}");
    let statuses: Vec<Phase> = api.outbox().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [Phase::Failed]);
}

/// Idle connections and partial bodies cannot hold the API (nor the process's file descriptors):
/// past the connection limit they wait in the backlog, and each is cut at its time limit, so a
/// real report still gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_clients_cannot_hold_the_api() {
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let limits = Limits {
        max_connections: 4,
        head_timeout: Duration::from_millis(500),
        connection_timeout: Duration::from_secs(1),
    };
    let api = start_with(limits).await;
    let address = api.base.trim_start_matches("http://").to_owned();
    let mut partial = Vec::new();
    for _ in 0..4 {
        let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        let head = "POST /sedna/workers/x/info HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n{\"na";
        stream.write_all(head.as_bytes()).await.unwrap();
        partial.push(stream);
    }
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(tokio::net::TcpStream::connect(&address).await.unwrap());
    }
    let worker = api.issue(1, "train");
    let started = Instant::now();
    let (status, reply) = api.post(&worker, sedna_body(&worker, "train", "/output/train/1/index.pkl")).await;
    assert_eq!((status, reply.message.as_str()), (200, "OK"));
    assert!(started.elapsed() < Duration::from_secs(20), "answered after {:?}", started.elapsed());
    // The partial bodies were closed by the server, not held open.
    for mut stream in partial {
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "a partial body is not held open");
    }
}

/// A train result with a model moves the job on to its eval step on the edge at once (the
/// relayed result says `nextFollows`), in the transaction that queues it; only from this edge's
/// own Train step of that round, never from a round the control plane already failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_train_result_moves_the_job_on_to_its_eval_step_at_once() {
    fn set_job(api: &Api, stage: &str, phase: &str, acted: &str) {
        let store = api.store.lock().unwrap();
        let sql = "UPDATE jobs SET round = 2, stage = ?2, phase = ?3, acted = ?4 WHERE name = ?1";
        store.conn().execute(sql, rusqlite::params![JOB, stage, phase, acted]).unwrap();
    }
    fn job_stage(api: &Api) -> (String, String) {
        let store = api.store.lock().unwrap();
        let sql = "SELECT stage, phase FROM jobs WHERE name = ?1";
        store.conn().query_row(sql, [JOB], |r| Ok((r.get(0)?, r.get(1)?))).unwrap()
    }
    let api = start().await;
    // As the edge's Train step of round 2 left it (Train Ready reported).
    set_job(&api, "Train", "Ready", "2/Train");
    let worker = api.issue(2, "train");
    assert_eq!(api.post(&worker, sedna_body(&worker, "train", "/output/train/2/index.pkl")).await.0, 200);
    let relayed = api.outbox();
    assert_eq!((relayed[0].phase, relayed[0].status, relayed[0].next_follows), (Stage::Train, Phase::Completed, true));
    assert_eq!(job_stage(&api), ("Eval".to_owned(), "Waiting".to_owned()), "the eval step is due now");
    assert_eq!(*api.moved.lock().unwrap(), [JOB], "the job's loop is told");

    // The control plane failed round 2 meanwhile (its notice came first): the result is relayed
    // as it is, and the job stays where the control plane put it.
    let api = start().await;
    set_job(&api, "Train", "Waiting", "2/Train");
    let worker = api.issue(2, "train");
    assert_eq!(api.post(&worker, sedna_body(&worker, "train", "/output/train/2/index.pkl")).await.0, 200);
    assert!(!api.outbox()[0].next_follows);
    assert_eq!(job_stage(&api), ("Train".to_owned(), "Waiting".to_owned()));
    assert!(api.moved.lock().unwrap().is_empty());

    // An eval result moves nothing: Deploy waits for the control plane's word.
    let api = start().await;
    set_job(&api, "Eval", "Ready", "2/Eval");
    let worker = api.issue(2, "eval");
    assert_eq!(api.post(&worker, sedna_body(&worker, "eval", "/output/train/2/index.pkl")).await.0, 200);
    assert!(!api.outbox()[0].next_follows);
    assert_eq!(job_stage(&api), ("Eval".to_owned(), "Ready".to_owned()));
    assert!(api.moved.lock().unwrap().is_empty());
}
