//! `perennial edge` as a child process, linked to a cloud side on 127.0.0.1 over real TLS: its
//! job comes down as desired state; with the cloud gone it goes on (samples split, a round's
//! report queued); killed with SIGKILL and restarted still offline, it runs from its own state;
//! when the cloud is back the queued report arrives, once, and the dataset's count after it. Then
//! the job's trigger is changed on the cloud: swapped in on the edge, its plugin and digest sent
//! back for the job's status; a trigger whose configure refuses its config is rejected with the
//! reason, the previous one serving on.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::link::{Pki, TestCloud, pki};
use perennial_link::cloud_server::{self, NodeDesired, ServerSettings};
use perennial_link::socket::{NodeTokens, server_tls};
use rusqlite::Connection;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const JOB: &str = "ml/thermal";

struct Cloud {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Cloud {
    async fn start(pki: &Pki, side: Arc<TestCloud>, address: SocketAddr) -> Cloud {
        let listener = TcpListener::bind(address).await.expect("bind the cloud's port");
        let settings = ServerSettings {
            tls: server_tls(pki.cert_pem.as_bytes(), pki.key_pem.as_bytes()).expect("server TLS"),
            tokens: watch::channel(Arc::new(NodeTokens::new([("edge-1", "token-one")]))).1,
            reviewer: None,
            refusals: Default::default(),
            heartbeat_secs: 1,
        };
        let (stop, stopped) = watch::channel(false);
        Cloud { stop, task: tokio::spawn(cloud_server::serve(listener, settings, side, stopped)) }
    }

    async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}

fn job(index: &Path, output: &Path, trigger: Value) -> Value {
    json!({
        "metadata": {"namespace": "ml", "name": "thermal", "uid": "uid-1"},
        "config": {
            "name": JOB, "uid": "uid-1",
            "spec": {"dataset": "ml/readings", "datasetUrl": index, "datasetFormat": "txt", "outputDir": output, "trainProb": 0.8},
            "trigger": trigger
        }
    })
}

fn threshold(samples: u32) -> Value {
    json!({"plugin": "builtin:threshold-trigger",
           "config": {"checkPeriodSeconds": 1, "condition": {"operator": ">=", "threshold": samples}}})
}

fn desired(job: Value) -> NodeDesired {
    let mut desired = NodeDesired::default();
    desired.jobs.insert(JOB.into(), job.into());
    let dataset =
        json!({"metadata": {"namespace": "ml", "name": "readings", "uid": "d-1"}, "spec": {"nodeName": "edge-1"}});
    desired.datasets.insert("ml/readings".into(), dataset.into());
    desired
}

struct Files {
    _root: tempfile::TempDir,
    state: PathBuf,
    index: PathBuf,
    output: PathBuf,
    token: PathBuf,
    ca: PathBuf,
}

fn files(pki: &Pki) -> Files {
    let root = tempfile::tempdir().expect("tempdir");
    let index = root.path().join("data/index.txt");
    std::fs::create_dir_all(index.parent().expect("parent")).expect("data dir");
    let token = root.path().join("token");
    std::fs::write(&token, "token-one\n").expect("token");
    let ca = root.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).expect("ca");
    Files { state: root.path().join("state"), output: root.path().join("output"), index, token, ca, _root: root }
}

fn start_edge(files: &Files, cloud: SocketAddr) -> Child {
    Command::new(env!("CARGO_BIN_EXE_perennial"))
        .args(["edge", "--bind-address", "127.0.0.1", "--bind-port", "0", "--poll-ms", "50"])
        .args(["--cloud-url", &format!("wss://localhost:{}/v1/link", cloud.port())])
        .arg("--token-file")
        .arg(&files.token)
        .arg("--ca-file")
        .arg(&files.ca)
        .args(["--node-name", "edge-1"])
        .arg("--state-dir")
        .arg(&files.state)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start perennial edge")
}

fn query<T: rusqlite::types::FromSql>(files: &Files, sql: &str) -> Option<T> {
    let conn = Connection::open(files.state.join("edge.db")).ok()?;
    conn.busy_timeout(Duration::from_secs(5)).ok()?;
    conn.query_row(sql, [], |row| row.get(0)).ok()
}

fn append_samples(files: &Files, from: usize, count: usize) {
    use std::io::Write;
    let mut index = std::fs::OpenOptions::new().create(true).append(true).open(&files.index).expect("index");
    for n in from..from + count {
        writeln!(index, "images/{n}.png {}", n % 3).expect("append");
    }
}

async fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_works_offline_survives_sigkill_and_delivers_what_it_queued_once() {
    let pki = pki();
    let files = files(&pki);
    let dir = tempfile::tempdir().expect("tempdir");
    let side = Arc::new(TestCloud::new(
        &dir.path().join("cloud.db"),
        desired(job(&files.index, &files.output, threshold(150))),
    ));
    let address = TcpListener::bind("127.0.0.1:0").await.expect("a free port").local_addr().expect("address");
    let cloud = Cloud::start(&pki, side.clone(), address).await;
    let mut edge = start_edge(&files, address);
    until("the job to come down the link", Duration::from_secs(60), || {
        query::<String>(&files, "SELECT uid FROM jobs WHERE name = 'ml/thermal'").is_some()
    })
    .await;

    // The cloud goes away; the edge goes on: samples are split and round 1 starts.
    cloud.stop().await;
    append_samples(&files, 0, 200);
    until("round 1's report queued", Duration::from_secs(30), || {
        query::<i64>(&files, "SELECT COUNT(*) FROM outbox WHERE body LIKE '%\"phase\":\"Train\"%'").unwrap_or(0) == 1
    })
    .await;
    edge.kill().expect("SIGKILL");
    let _ = edge.wait();

    // Restarted with the cloud still away: it runs its job from its own state.
    let mut edge = start_edge(&files, address);
    append_samples(&files, 200, 50);
    until("the new samples split offline", Duration::from_secs(30), || {
        query::<i64>(&files, "SELECT cursor_samples FROM jobs WHERE name = 'ml/thermal'").unwrap_or(0) == 250
    })
    .await;
    assert!(side.applied().is_empty(), "nothing reached the cloud while it was away");

    // The cloud is back: the queued report arrives, once.
    let cloud = Cloud::start(&pki, side.clone(), address).await;
    until("the queued report applied", Duration::from_secs(60), || !side.applied().is_empty()).await;
    until("the outbox emptied", Duration::from_secs(30), || {
        query::<i64>(&files, "SELECT COUNT(*) FROM outbox").unwrap_or(-1) == 0
    })
    .await;
    let stage_reports: Vec<Value> =
        side.applied().into_iter().map(|(_, body)| body).filter(|body| body.get("phase").is_some()).collect();
    assert_eq!(stage_reports.len(), 1, "round 1's report, once: {stage_reports:?}");
    let report = &stage_reports[0];
    assert_eq!(
        (report["job"].as_str(), report["phase"].as_str(), report["status"].as_str()),
        (Some(JOB), Some("Train"), Some("Ready"))
    );
    assert_eq!((report["jobUid"].as_str(), report["round"].as_i64()), (Some("uid-1"), Some(1)));
    // The dataset's sample count follows, for its status.
    until("the dataset's count", Duration::from_secs(30), || {
        side.applied().iter().any(|(_, body)| body["dataset"] == "ml/readings" && body["numberOfSamples"] == 250)
    })
    .await;

    // A policy change on the cloud is swapped in on the edge, and its status goes back up.
    let plugin = perennial_policy::builtin::built_plugin_path("count-or-age-trigger").expect("the example plugin");
    let count_or_age = |samples: u32| json!({"plugin": plugin, "config": {"samples": samples, "maxAgeHours": 1}});
    side.desired.send_replace(Arc::new(desired(job(&files.index, &files.output, count_or_age(300)))));
    let trigger_status = || {
        side.applied()
            .into_iter()
            .rev()
            .find_map(|(_, body)| body.get("policies").map(|policies| policies["trigger"].clone()))
    };
    until("the new trigger serving, said to the cloud", Duration::from_secs(30), || {
        trigger_status().is_some_and(|t| t["plugin"] == json!(plugin) && t["health"] == "Serving")
    })
    .await;
    let swapped = trigger_status().expect("the trigger's status");
    let digest = swapped["digest"].as_str().expect("a digest").to_owned();
    // One whose configure refuses its config is rejected; the previous one serves on.
    side.desired.send_replace(Arc::new(desired(job(&files.index, &files.output, count_or_age(0)))));
    until("the bad trigger rejected, said to the cloud", Duration::from_secs(30), || {
        trigger_status().is_some_and(|t| t["health"] == "LoadFailed")
    })
    .await;
    let rejected = trigger_status().expect("the trigger's status");
    let message = rejected["message"].as_str().unwrap_or_default();
    assert!(message.contains("samples: must be at least 1"), "{message}");
    assert_eq!(rejected["digest"], digest.as_str(), "the swapped-in trigger still serves");
    edge.kill().expect("SIGKILL");
    let _ = edge.wait();
    cloud.stop().await;
}
