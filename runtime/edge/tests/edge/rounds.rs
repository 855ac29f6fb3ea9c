//! A job's rounds on the edge: ingest → trigger → train file → eval set → selection → deploy,
//! against the node's filesystem and against a real S3 server on 127.0.0.1, with the real Wasm
//! policies and a real SQLite file.

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::support::s3::S3Server;
use perennial_edge::model_copy::{self, ModelCopier, ModelCopy, model_copier};
use perennial_edge::report::{self, Model};
use perennial_edge::rounds::{self, Clock, Index, Outcome, OutputDir};
use perennial_edge::sqlite::Store;
use perennial_edge::{self as edge, IndexFile, IngestLimits, LocalFile, Split};
use perennial_policy::{
    Kind, OnError, Policy, PolicyHost, PolicyRef, SelectorKind, SplitterKind, TracingEvents, TriggerKind, builtin,
};
use perennial_storage::S3Credentials;
use perennial_types::{Phase, Stage};

const JOB: &str = "default/thermal";
const CLOCK: Clock = Clock { now: 1_700_000_000, utc_offset_secs: 0 };

fn policy<K: Kind>(plugin: &str, config: serde_json::Value) -> Policy<K> {
    let mut reference = PolicyRef::new(plugin).with_config(config);
    reference.on_error = OnError::Hold;
    let valid = reference.validate().unwrap();
    let name = plugin.strip_prefix("builtin:").unwrap();
    PolicyHost::new(None, None)
        .unwrap()
        .load_bytes::<K>(&valid, builtin::component(name).unwrap(), Arc::new(TracingEvents { job: JOB.into() }))
        .unwrap()
}

struct Edge {
    dir: tempfile::TempDir,
    store: Mutex<Store>,
    output_url: String,
    op: opendal::blocking::Operator,
    s3: Option<S3Credentials>,
    splitter: Policy<SplitterKind>,
    trigger: Policy<TriggerKind>,
    selector: Policy<SelectorKind>,
    eval_set_size: u64,
    rt: tokio::runtime::Handle,
}

impl Edge {
    fn new(output_url: Option<String>, s3: Option<S3Credentials>, rt: tokio::runtime::Handle) -> Edge {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("state.db")).unwrap();
        edge::register_job(&mut store, JOB, "uid-1", &edge::JobSpec::default()).unwrap();
        let output_url = output_url.unwrap_or_else(|| dir.path().join("output").display().to_string());
        let op = {
            let _guard = rt.enter();
            let op = edge::output::output_operator(&output_url, s3.as_ref()).unwrap();
            opendal::blocking::Operator::new(op).unwrap()
        };
        Edge {
            store: Mutex::new(store),
            output_url,
            op,
            s3,
            splitter: policy("builtin:ratio-split", serde_json::json!({"trainProb": 0.8})),
            trigger: policy(
                "builtin:threshold-trigger",
                serde_json::json!({"condition": {"operator": ">=", "threshold": 8}}),
            ),
            selector: policy("builtin:metric-select", serde_json::json!({"metric": "accuracy"})),
            eval_set_size: edge::DEFAULT_EVAL_SET_SIZE,
            rt,
            dir,
        }
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap()
    }

    fn index_path(&self) -> std::path::PathBuf {
        self.dir.path().join("index.txt")
    }

    fn append(&mut self, from: usize, n: usize) {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(self.index_path()).unwrap();
        for i in from..from + n {
            writeln!(file, "images/{i}.jpg").unwrap();
        }
        let mut index = LocalFile { path: self.index_path() };
        let split = Split { policy: Some(&self.splitter), train_prob: 0.8, shadow: None };
        edge::ingest(&self.store, JOB, &mut index, false, &split, IngestLimits::default()).unwrap();
    }

    fn index(&mut self) -> (LocalFile, String) {
        let path = self.index_path();
        (LocalFile { path: path.clone() }, path.display().to_string())
    }

    fn train(&mut self) -> Outcome {
        let (mut file, url) = self.index();
        let mut index = Index { file: &mut file, csv: false, url: &url, max_line: 1 << 20 };
        let output = OutputDir { url: &self.output_url, op: &self.op };
        rounds::train_waiting(&self.store, JOB, &mut index, &output, &self.trigger, CLOCK, None).unwrap()
    }

    fn eval(&mut self) -> Outcome {
        let (mut file, url) = self.index();
        let mut index = Index { file: &mut file, csv: false, url: &url, max_line: 1 << 20 };
        let output = OutputDir { url: &self.output_url, op: &self.op };
        rounds::eval_waiting(&self.store, JOB, &mut index, &output, self.eval_set_size, CLOCK).unwrap()
    }

    fn deploy(&mut self) -> Outcome {
        let output = OutputDir { url: &self.output_url, op: &self.op };
        let copy = self.copier();
        rounds::deploy_waiting(&self.store, JOB, &output, &copy, &self.selector, CLOCK, None).unwrap()
    }

    /// The job's model copier, as the agent makes it: models inside its output directory.
    fn copier(&self) -> ModelCopier {
        let output_url = self.output_url.clone();
        model_copier(self.rt.clone(), self.s3.clone(), output_url.clone(), vec![output_url])
    }

    fn stage(&self, stage: &str) {
        let stage = Stage::parse(stage).expect("a stage");
        rounds::set_stage(&mut self.store(), JOB, stage, Phase::Waiting).unwrap();
    }

    fn worker_result(&self, round: i64, stage: &str, models: Vec<Model>) {
        let mut store = self.store();
        let tx = store.write().unwrap();
        rounds::record_result(&tx, JOB, round, stage, &models).unwrap();
        tx.commit().unwrap();
    }

    /// A file in the output directory, by its path there.
    fn output_file(&self, path: &str) -> String {
        String::from_utf8(self.op.read(path).unwrap().to_vec()).unwrap()
    }

    /// A model file that a worker wrote under the output directory.
    fn model(&self, path: &str, bytes: &[u8], accuracy: f64) -> Model {
        self.op.write(path, bytes.to_vec()).unwrap();
        Model {
            format: "pkl".into(),
            url: format!("{}/{path}", self.output_url),
            metrics: Some(serde_json::json!({"accuracy": accuracy})),
        }
    }
}

fn reported(outcome: Outcome) -> report::Report {
    match outcome {
        Outcome::Reported(report) => *report,
        Outcome::Waiting { reason, .. } | Outcome::NotDue { reason } => panic!("expected a report, waiting: {reason}"),
    }
}

fn waiting(outcome: Outcome) -> String {
    match outcome {
        Outcome::Waiting { reason, .. } | Outcome::NotDue { reason } => reason,
        Outcome::Reported(report) => panic!("expected to wait, reported {report:?}"),
    }
}

fn two_rounds(edge: &mut Edge) {
    let out = edge.output_url.clone();
    // 9 new samples: 7 train (floor(0.8 × 9); samples 0 and 5 go to eval), under the threshold of 8.
    edge.append(0, 9);
    assert_eq!(waiting(edge.train()), "num_of_samples 7 is not >= 8");
    // 5 more: floor(0.8 × 14) = 11 train in all (sample 10 to eval).
    edge.append(9, 5);
    let ready = reported(edge.train());
    assert_eq!((ready.phase, ready.status, ready.round), (Stage::Train, Phase::Ready, 1));
    let input = ready.input.clone().unwrap();
    assert_eq!(input.data_url.as_deref(), Some(format!("{out}/data/train/1/data.txt").as_str()));
    assert_eq!(input.output_dir.as_deref(), Some(format!("{out}/train/1").as_str()));
    let train_file = edge.output_file("data/train/1/data.txt");
    assert_eq!(train_file.lines().count(), 11);
    assert!(train_file.starts_with("images/1.jpg\n"));
    assert!(!train_file.contains("images/5.jpg"), "the eval samples are not trained on");
    // The report is in the outbox, and is not sent twice.
    assert_eq!(report::pending(&edge.store(), 10).unwrap().len(), 1);
    assert!(waiting(edge.train()).contains("not Train/Waiting"));

    // Eval waits for the train result, then writes the eval set once per sample.
    edge.stage("Eval");
    assert_eq!(waiting(edge.eval()), "waiting for the train result of round 1");
    let trained = edge.model("train/1/index.pkl", b"model-1", 0.0);
    edge.worker_result(1, "train", vec![Model { metrics: None, ..trained.clone() }]);
    let eval_ready = reported(edge.eval());
    assert_eq!(eval_ready.input.as_ref().unwrap().models[0].url, trained.url);
    let eval_file = edge.output_file("data/eval/1/data.txt");
    assert_eq!(eval_file, "images/0.jpg\nimages/5.jpg\nimages/10.jpg\n");

    // Deploy: the candidate beats nothing deployed.
    edge.stage("Deploy");
    let candidate = edge.model("eval/1/index.pkl", b"evaluated-model-1", 0.81);
    edge.worker_result(1, "eval", vec![candidate]);
    let deployed = reported(edge.deploy());
    assert_eq!((deployed.status, deployed.round), (Phase::Ready, 1));
    assert_eq!(edge.output_file("deploy/index.pkl"), "evaluated-model-1");
    assert_eq!(deployed.input.unwrap().models[0].url, format!("{out}/deploy/index.pkl"));

    // Round 2: the deployed model's metrics reach the trigger; a worse candidate is not deployed.
    edge.stage("Train");
    edge.append(14, 10);
    let stats = rounds::trigger_stats(&edge.store(), JOB, CLOCK).unwrap();
    assert_eq!(stats.deployed_metrics.get("accuracy"), Some(&0.81));
    assert_eq!((stats.pending_train, stats.rounds_completed), (8, 1));
    assert_eq!(reported(edge.train()).round, 2);
    assert_eq!(edge.output_file("data/train/2/data.txt").lines().count(), 8, "only the new train samples");
    edge.stage("Eval");
    let trained = edge.model("train/2/index.pkl", b"model-2", 0.0);
    edge.worker_result(2, "train", vec![trained]);
    reported(edge.eval());
    // The rolling eval set: the job's last 100 eval samples, each once (Sedna repeats them).
    let eval_file = edge.output_file("data/eval/2/data.txt");
    assert_eq!(eval_file, "images/0.jpg\nimages/5.jpg\nimages/10.jpg\nimages/15.jpg\nimages/20.jpg\n");
    edge.stage("Deploy");
    let worse = edge.model("eval/2/index.pkl", b"evaluated-model-2", 0.75);
    edge.worker_result(2, "eval", vec![worse]);
    let kept = reported(edge.deploy());
    assert_eq!(kept.status, Phase::Completed);
    assert!(kept.reason.unwrap().contains("does not beat deployed 0.81"));
    assert_eq!(edge.output_file("deploy/index.pkl"), "evaluated-model-1", "the deployed model stays");

    let all = report::pending(&edge.store(), 100).unwrap();
    let phases: Vec<String> = all.iter().map(|(_, r)| format!("{}/{}/{}", r.round, r.phase, r.status)).collect();
    assert_eq!(
        phases,
        ["1/Train/Ready", "1/Eval/Ready", "1/Deploy/Ready", "2/Train/Ready", "2/Eval/Ready", "2/Deploy/Completed"]
    );
    assert!(all.iter().all(|(_, r)| r.job_uid == "uid-1"));
    report::acknowledge(&mut edge.store(), all[2].0).unwrap();
    assert_eq!(report::pending(&edge.store(), 100).unwrap().len(), 3);
}

#[test]
fn two_rounds_on_the_local_filesystem() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut edge = Edge::new(None, None, rt.handle().clone());
    two_rounds(&mut edge);
    // No temporary file is left beside the outputs.
    let tmp = std::path::Path::new(&edge.output_url).join(".perennial-tmp");
    assert_eq!(std::fs::read_dir(tmp).unwrap().count(), 0);
}

#[test]
fn two_rounds_on_s3() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(S3Server::start());
    std::fs::create_dir_all(server.root.path().join("models")).unwrap();
    let mut edge = Edge::new(Some("s3://models/thermal".into()), Some(server.credentials()), rt.handle().clone());
    two_rounds(&mut edge);
    assert!(server.root.path().join("models/thermal/deploy/index.pkl").exists());
}

/// A model bigger than an upload part goes to an S3 output directory as a streamed multipart
/// upload, and a model on S3 comes to a local output directory as its body arrives: byte for
/// byte both ways. What is refused names the object, and leaves the deployed model as it was.
#[test]
fn a_model_is_streamed_to_and_from_s3() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(S3Server::start());
    std::fs::create_dir_all(server.root.path().join("models")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("output");
    std::fs::create_dir_all(output.join("eval/1")).unwrap();
    let bytes: Vec<u8> = (0..(20 << 20) + 333).map(|i: usize| (i % 251) as u8).collect();
    let model = output.join("eval/1/index.pkl");
    std::fs::write(&model, &bytes).unwrap();
    let size = bytes.len() as u64;

    let creds = Some(server.credentials());
    let to_s3 = model_copier(
        rt.handle().clone(),
        creds.clone(),
        "s3://models/thermal".into(),
        vec![output.display().to_string()],
    );
    assert_eq!(to_s3(&model.display().to_string(), "deploy/index.pkl").unwrap(), size);
    let on_s3 = server.root.path().join("models/thermal/deploy/index.pkl");
    assert!(std::fs::read(&on_s3).unwrap() == bytes, "the uploaded model differs");

    let local = dir.path().join("local");
    let to_local = model_copier(rt.handle().clone(), creds.clone(), local.display().to_string(), vec![]);
    assert_eq!(to_local("s3://models/thermal/deploy/index.pkl", "deploy/index.pkl").unwrap(), size);
    assert!(std::fs::read(local.join("deploy/index.pkl")).unwrap() == bytes, "the downloaded model differs");
    assert_eq!(std::fs::read_dir(local.join(".perennial-tmp")).unwrap().count(), 0);

    let err = to_local("s3://models/thermal/missing.pkl", "deploy/index.pkl").unwrap_err();
    assert!(err.starts_with("s3://models/thermal/missing.pkl: "), "{err}");
    let small = ModelCopy {
        runtime: rt.handle().clone(),
        s3: creds,
        output_dir: "s3://models/thermal".into(),
        roots: vec![],
        limit: perennial_storage::ReadLimit { max_bytes: size - 1, ..model_copy::DEPLOY_LIMIT },
    };
    let err = small.copy("s3://models/thermal/deploy/index.pkl", "deploy/index.pkl").unwrap_err();
    assert!(err.ends_with(&format!("{size} bytes, over the {}-byte limit", size - 1)), "{err}");
    let err = small.copy(&model.display().to_string(), "deploy/index.pkl").unwrap_err();
    assert!(err.contains("outside the job's output and dataset"), "{err}");
    assert!(std::fs::read(&on_s3).unwrap() == bytes, "the deployed model stays");
}

/// A dataset that grows one line at a time: each line is a batch of one, where Sedna's per-batch
/// rule (floor(0.8 × 1) = 0) would send every sample to eval and never train. The cumulative
/// rule trains floor(0.8 × n) of the first n lines, so `num_of_samples > 50` holds at line 64
/// (51 train) and not before (line 63: 50). The eval set is the last `evalSetSize` eval samples,
/// not the eval samples of the last few batches (which would be one or two samples here).
#[test]
fn a_dataset_growing_one_line_at_a_time_trains_by_line_64_with_a_full_eval_set() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut edge = Edge::new(None, None, rt.handle().clone());
    edge.trigger = policy(
        "builtin:threshold-trigger",
        serde_json::json!({"condition": {"operator": ">", "threshold": 50, "metric": "num_of_samples"}}),
    );
    edge.eval_set_size = 10;
    for line in 0..63 {
        edge.append(line, 1);
        let trained = (line as u64 + 1) * 4 / 5;
        assert_eq!(waiting(edge.train()), format!("num_of_samples {trained} is not > 50"), "line {}", line + 1);
    }
    edge.append(63, 1);
    let ready = reported(edge.train());
    assert_eq!((ready.phase, ready.round), (Stage::Train, 1));
    assert_eq!(ready.reason.as_deref(), Some("num_of_samples 51 > 50"));
    let batches = edge::batches(&edge.store(), JOB).unwrap();
    assert_eq!(batches.len(), 64, "a batch per line");
    assert!(batches.iter().all(|b| b.assignments.len() == 1));
    let train_file = edge.output_file("data/train/1/data.txt");
    assert_eq!(train_file.lines().count(), 51);
    // The eval samples are every fifth line: 0, 5, ..., 60 (13 of them); the eval set is the last 10.
    edge.stage("Eval");
    let trained = edge.model("train/1/index.pkl", b"model-1", 0.0);
    edge.worker_result(1, "train", vec![trained]);
    reported(edge.eval());
    let eval_file = edge.output_file("data/eval/1/data.txt");
    let expected: String = (15..=60).step_by(5).map(|i| format!("images/{i}.jpg\n")).collect();
    assert_eq!(eval_file, expected);
    assert!(!train_file.lines().any(|l| eval_file.lines().any(|e| e == l)), "no sample both trains and evaluates");
}

/// The eval set cuts through a batch: only the latest `evalSetSize` eval samples, in order.
#[test]
fn the_eval_set_is_the_latest_eval_samples_across_batches() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut edge = Edge::new(None, None, rt.handle().clone());
    edge.eval_set_size = 4;
    edge.append(0, 30); // eval: 0, 5, ..., 25
    edge.append(30, 7); // eval: 30, 35
    reported(edge.train());
    edge.stage("Eval");
    let trained = edge.model("train/1/index.pkl", b"model-1", 0.0);
    edge.worker_result(1, "train", vec![trained]);
    reported(edge.eval());
    let eval_file = edge.output_file("data/eval/1/data.txt");
    assert_eq!(eval_file, "images/20.jpg\nimages/25.jpg\nimages/30.jpg\nimages/35.jpg\n");
}

#[test]
fn a_failed_copy_reports_deploy_failed_with_the_cause() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut edge = Edge::new(None, None, rt.handle().clone());
    edge.append(0, 20);
    reported(edge.train());
    edge.stage("Deploy");
    let missing = Model {
        format: "pkl".into(),
        url: format!("{}/eval/1/missing.pkl", edge.output_url),
        metrics: Some(serde_json::json!({"accuracy": 0.9})),
    };
    edge.worker_result(1, "eval", vec![missing]);
    let failed = reported(edge.deploy());
    assert_eq!(failed.status, Phase::Failed);
    assert!(failed.reason.as_deref().unwrap().contains("missing.pkl"), "{failed:?}");
    assert!(edge.op.read("deploy/index.pkl").is_err(), "nothing half-deployed");
}

#[test]
fn an_index_overwritten_in_place_is_caught_before_it_reaches_a_round_file() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut edge = Edge::new(None, None, rt.handle().clone());
    edge.append(0, 20);
    // Same length, same inode, other bytes: nothing tells but the content.
    let text = std::fs::read_to_string(edge.index_path()).unwrap().replace("images/", "picture");
    std::fs::write(edge.index_path(), text).unwrap();
    let (mut file, url) = edge.index();
    let mut index = Index { file: &mut file, csv: false, url: &url, max_line: 1 << 20 };
    let output = OutputDir { url: &edge.output_url, op: &edge.op };
    let err = rounds::train_waiting(&edge.store, JOB, &mut index, &output, &edge.trigger, CLOCK, None).unwrap_err();
    assert!(err.to_string().contains("changed since they were read"), "{err}");
    assert!(edge.op.read("data/train/1/data.txt").is_err(), "no round file was published");
    assert!(report::pending(&edge.store(), 10).unwrap().is_empty(), "no round was reported");
}

#[test]
fn a_model_that_resolves_outside_the_job_is_not_deployed() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("output");
    std::fs::create_dir_all(output.join("eval/1")).unwrap();
    std::fs::write(output.join("eval/1/index.pkl"), b"model").unwrap();
    let secret = dir.path().join("secret.db");
    std::fs::write(&secret, b"not for workers").unwrap();
    std::os::unix::fs::symlink(&secret, output.join("eval/1/link.pkl")).unwrap();
    let output_dir = output.display().to_string();
    let copy = model_copier(rt.handle().clone(), None, output_dir.clone(), vec![output_dir]);
    assert_eq!(copy(&output.join("eval/1/index.pkl").display().to_string(), "deploy/index.pkl").unwrap(), 5);
    assert_eq!(std::fs::read(output.join("deploy/index.pkl")).unwrap(), b"model");
    let err = copy(&output.join("eval/1/link.pkl").display().to_string(), "deploy/index.pkl").unwrap_err();
    assert!(err.contains("outside the job's output and dataset"), "{err}");
    assert_eq!(std::fs::read(output.join("deploy/index.pkl")).unwrap(), b"model", "the deployed model stays");
}

/// The job's index as a step reads it, noting each read made while the store was locked.
struct Probed<'a> {
    file: LocalFile,
    store: &'a Mutex<Store>,
    reads: usize,
    reads_under_lock: usize,
}

impl Probed<'_> {
    fn look(&mut self) {
        self.reads += 1;
        if self.store.try_lock().is_err() {
            self.reads_under_lock += 1;
        }
    }
}

impl IndexFile for Probed<'_> {
    fn stat(&mut self) -> std::io::Result<Option<edge::FileStat>> {
        self.look();
        self.file.stat()
    }

    fn read_at(&mut self, offset: u64, max: usize) -> std::io::Result<Vec<u8>> {
        self.look();
        self.file.read_at(offset, max)
    }

    fn name(&self) -> String {
        self.file.name()
    }
}

/// The worker API and the link share the store with the job loop: a step never holds it while
/// it reads the index, writes a round file or copies a model (a slow disk or S3 would hold them
/// all up).
#[test]
fn the_store_is_free_while_a_step_reads_the_index_and_copies_the_model() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let edge = Edge::new(None, None, rt.handle().clone());
    let mut text = String::new();
    for i in 0..20 {
        text.push_str(&format!("images/{i}.jpg\n"));
    }
    std::fs::write(edge.index_path(), text).unwrap();
    let (url, output) = (edge.index_path().display().to_string(), OutputDir { url: &edge.output_url, op: &edge.op });
    let mut probed =
        Probed { file: LocalFile { path: edge.index_path() }, store: &edge.store, reads: 0, reads_under_lock: 0 };
    let split = Split { policy: Some(&edge.splitter), train_prob: 0.8, shadow: None };
    assert_eq!(
        edge::ingest(&edge.store, JOB, &mut probed, false, &split, IngestLimits::default()).unwrap().samples,
        20
    );
    let mut index = Index { file: &mut probed, csv: false, url: &url, max_line: 1 << 20 };
    reported(rounds::train_waiting(&edge.store, JOB, &mut index, &output, &edge.trigger, CLOCK, None).unwrap());
    rounds::set_stage(&mut edge.store(), JOB, Stage::Eval, Phase::Waiting).unwrap();
    let trained = edge.model("train/1/index.pkl", b"model-1", 0.0);
    edge.worker_result(1, "train", vec![trained]);
    reported(rounds::eval_waiting(&edge.store, JOB, &mut index, &output, 100, CLOCK).unwrap());
    assert!(probed.reads >= 4, "ingest, the train file and the eval set read the index: {} reads", probed.reads);
    assert_eq!(probed.reads_under_lock, 0, "reads of the index while the store was locked");

    rounds::set_stage(&mut edge.store(), JOB, Stage::Deploy, Phase::Waiting).unwrap();
    let candidate = edge.model("eval/1/index.pkl", b"evaluated-model-1", 0.9);
    edge.worker_result(1, "eval", vec![candidate]);
    let copies_under_lock = std::cell::Cell::new(0);
    let copier = edge.copier();
    let copy = |url: &str, dest: &str| {
        if edge.store.try_lock().is_err() {
            copies_under_lock.set(copies_under_lock.get() + 1);
        }
        copier(url, dest)
    };
    let deployed =
        reported(rounds::deploy_waiting(&edge.store, JOB, &output, &copy, &edge.selector, CLOCK, None).unwrap());
    assert_eq!(deployed.status, Phase::Ready);
    assert_eq!(copies_under_lock.get(), 0, "the model was copied while the store was locked");
}

/// A step commits only what it read: when the control plane moves the job while the step works
/// without the lock (here during the model's copy), it commits nothing, and says why.
#[test]
fn a_step_commits_nothing_when_the_job_moves_while_it_works() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut edge = Edge::new(None, None, rt.handle().clone());
    edge.append(0, 20);
    reported(edge.train());
    edge.stage("Deploy");
    let candidate = edge.model("eval/1/index.pkl", b"evaluated-model-1", 0.9);
    edge.worker_result(1, "eval", vec![candidate]);
    let output = OutputDir { url: &edge.output_url, op: &edge.op };
    let copier = edge.copier();
    let copy = |url: &str, dest: &str| {
        // The control plane's word arrives meanwhile: the round failed, back to Train.
        let notice = perennial_types::StageNotice { stage: Stage::Train, round: 1, failed: true };
        assert!(rounds::apply_notice(&mut edge.store(), JOB, &notice).unwrap());
        copier(url, dest)
    };
    let outcome = rounds::deploy_waiting(&edge.store, JOB, &output, &copy, &edge.selector, CLOCK, None).unwrap();
    assert!(waiting(outcome).contains("the job changed while the step ran"));
    let phases: Vec<String> = report::pending(&edge.store(), 10)
        .unwrap()
        .iter()
        .map(|(_, r)| format!("{}/{}/{}", r.round, r.phase, r.status))
        .collect();
    assert_eq!(phases, ["1/Train/Ready"], "no Deploy report");
    let stats = rounds::trigger_stats(&edge.store(), JOB, CLOCK).unwrap();
    assert!(stats.deployed_metrics.is_empty(), "nothing recorded as deployed");
    assert_eq!(stats.pending_train, 16, "the failed round's train samples are pending again");
    // The next turn acts on the job as it now is: round 2 starts.
    assert_eq!(reported(edge.train()).round, 2);
}
